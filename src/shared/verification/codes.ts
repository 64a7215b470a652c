/**
 * Every issue code of rule 8 of docs/verification.md: severity
 * (docs/verification.md "Issue codes"), retryable (rule 7, exactly these four), the score it caps
 * the result at when it is the primary error (rule 5), and the score it takes away when it is a
 * warning (rule 6). The order of this table is the order of `issues`: errors before warnings,
 * primary reason first.
 */
export type IssueCode =
  | 'quota_exceeded'
  | 'internal_error'
  | 'invalid_format'
  | 'test_email'
  | 'spam_domain'
  | 'disposable_email'
  | 'invalid_domain'
  | 'previously_complained'
  | 'previously_bounced'
  | 'globally_suppressed'
  | 'mailbox_not_found'
  | 'mailbox_full'
  | 'mailbox_unknown'
  | 'domain_typo'
  | 'spam_like'
  | 'role_based'
  | 'suspicious_domain'
  | 'privacy_alias'
  | 'catch_all';

export type Severity = 'error' | 'warning';

interface CodeRule {
  severity: Severity;
  retryable: boolean;
  /** Errors: the score of a result whose primary error this is (null: nothing checked). */
  score?: number | null;
  /** Warnings: points taken from the score of an accepted result. */
  reduction?: number;
}

export const ISSUE_CODES: Record<IssueCode, CodeRule> = {
  quota_exceeded: { severity: 'error', retryable: true, score: null },
  internal_error: { severity: 'error', retryable: true, score: null },
  invalid_format: { severity: 'error', retryable: false, score: 0 },
  test_email: { severity: 'error', retryable: false, score: 0 },
  spam_domain: { severity: 'error', retryable: false, score: 0 },
  disposable_email: { severity: 'error', retryable: false, score: 10 },
  invalid_domain: { severity: 'error', retryable: false, score: 0 },
  previously_complained: { severity: 'error', retryable: false, score: 5 },
  previously_bounced: { severity: 'error', retryable: false, score: 0 },
  globally_suppressed: { severity: 'error', retryable: false, score: 0 },
  mailbox_not_found: { severity: 'error', retryable: false, score: 0 },
  mailbox_full: { severity: 'error', retryable: true, score: 15 },
  mailbox_unknown: { severity: 'warning', retryable: true, reduction: 0 },
  domain_typo: { severity: 'warning', retryable: false, reduction: 35 },
  spam_like: { severity: 'warning', retryable: false, reduction: 30 },
  role_based: { severity: 'warning', retryable: false, reduction: 10 },
  suspicious_domain: { severity: 'warning', retryable: false, reduction: 0 },
  privacy_alias: { severity: 'warning', retryable: false, reduction: 0 },
  catch_all: { severity: 'warning', retryable: false, reduction: 0 },
};

const ORDER = Object.keys(ISSUE_CODES) as IssueCode[];

export interface Issue {
  code: IssueCode;
  message: string;
  severity: Severity;
  retryable: boolean;
}

export function issue(code: IssueCode, message: string): Issue {
  const rule = ISSUE_CODES[code];
  return { code, message, severity: rule.severity, retryable: rule.retryable };
}

/** Primary reason first: table order, one issue per code (the first one given wins). */
export function orderIssues(issues: Issue[]): Issue[] {
  const seen = new Set<IssueCode>();
  return issues
    .filter((i) => (seen.has(i.code) ? false : (seen.add(i.code), true)))
    .sort((a, b) => ORDER.indexOf(a.code) - ORDER.indexOf(b.code));
}
