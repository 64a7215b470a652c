/**
 * A refusal of an SMTP command, with its reply code and RFC 3463 enhanced status code
 * (docs/smtp.md "Authentication, limits and replies"). smtp-server sends `responseCode` and
 * `message` as the reply line, so the enhanced code leads the message: `552 5.3.4 Message too big`.
 */
export class SmtpReplyError extends Error {
  readonly responseCode: number;

  constructor(code: number, enhanced: string, text: string) {
    super(`${enhanced} ${text}`);
    this.name = 'SmtpReplyError';
    this.responseCode = code;
  }
}

/** The replies the SMTP listeners give (submission, and the inbound listener for bounces), in one place. */
export const replies = {
  authRequired: '5.7.0 Authentication required',
  badCredentials: () => new SmtpReplyError(535, '5.7.8', 'Authentication credentials invalid'),
  encryptionRequired: () => new SmtpReplyError(538, '5.7.11', 'Encryption required for requested authentication mechanism'),
  /** MAIL on a production connection without TLS, where AUTH is not offered (RFC 3207 4.2). */
  tlsFirst: (canStartTls: boolean) =>
    new SmtpReplyError(530, '5.7.0', canStartTls ? 'Must issue a STARTTLS command first' : 'Authentication required, and AUTH is offered only over TLS (this listener has no certificate)'),
  authUnavailable: () => new SmtpReplyError(454, '4.7.0', 'Temporary authentication failure, try again later'),
  rateLimited: (limit: number, of: 'token' | 'organization' = 'token') =>
    new SmtpReplyError(421, '4.7.0', `Rate limit of ${limit} messages a second for this ${of} exceeded, try again later`),
  tooManyRecipients: (max: number) => new SmtpReplyError(452, '4.5.3', `Too many recipients (at most ${max} a message)`),
  badRecipient: () => new SmtpReplyError(553, '5.1.3', 'Invalid recipient address'),
  noSuchRecipient: () => new SmtpReplyError(550, '5.1.1', 'No such recipient here'),
  tooBig: (max: number) => new SmtpReplyError(552, '5.3.4', `Message exceeds the maximum size of ${max} bytes`),
  malformed: (why: string) => new SmtpReplyError(554, '5.6.0', why),
  notAllowed: (why: string) => new SmtpReplyError(550, '5.7.1', why),
  tryLater: () => new SmtpReplyError(451, '4.3.0', 'Temporary failure storing the message, try again later'),
};
