import { z } from 'zod';

/**
 * A whole number given as text (a query parameter, an environment variable), in decimal digits,
 * then checked by `number` (its bounds and their messages). `Number()`, and so
 * `z.coerce.number()`, reads `0x10` as 16, `1e3` as 1000 and an empty value as 0, and a number
 * past 2^53 failed with that bound in its message rather than the value's own.
 */
export function wholeNumber<T extends z.ZodType>(number: T, options: { /** An environment variable's value: a sign and surrounding blanks are taken. */ variable?: boolean; tooLarge?: string } = {}) {
  const digits = options.variable ? /^[-+]?\d+$/ : /^\d+$/;
  return z.preprocess((value, ctx) => {
    if (typeof value !== 'string') return value;
    const text = options.variable ? value.trim() : value;
    if (!digits.test(text)) {
      ctx.addIssue({ code: 'custom', message: 'must be a whole number written in digits' });
      return z.NEVER;
    }
    const parsed = Number(text);
    if (!Number.isSafeInteger(parsed)) {
      ctx.addIssue({ code: 'custom', message: options.tooLarge ?? 'is too large' });
      return z.NEVER;
    }
    return parsed;
  }, number);
}
