/** Small HTML helpers shared by the MAILY and PLATE renderers. */
/** A link target kept only when it is http(s), mailto, tel, a relative path or a placeholder. */
export function safeUrl(value: unknown): string {
  if (typeof value !== 'string') return '';
  const url = value.trim();
  if (/^(https?:|mailto:|tel:|\/|#|\{\{)/i.test(url)) return url;
  return '';
}

export const isObject = (v: unknown): v is Record<string, unknown> => !!v && typeof v === 'object' && !Array.isArray(v);

export const UNSUBSCRIBE_TARGET = /^\s*(?:\{\{|%7B%7B)\s*unsubscribe_url\s*(?:\}\}|%7D%7D)\s*$/i;
