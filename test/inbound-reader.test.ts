import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parseFieldBlocks } from '../src/shared/bounces/fields.js';
import { readDsnDirectly, readReport, readWithMailparser } from '../src/shared/bounces/report.js';
import { ReturnPaths, returnPathHost } from '../src/shared/bounces/return-path.js';
import { verdictOf } from '../src/shared/bounces/verdict.js';
import { newId } from '../src/shared/ids.js';

const SECRET = 'test-secret-key-test-secret-key-0123456789';
const paths = new ReturnPaths(SECRET);

const SENT = {
  returnPath: 'b+01jexampleexampleexample0aaaaaaaaaaaaaaaaaa@bounces.acme.test',
  to: 'jane@example.com',
  from: 'Acme <news@acme.test>',
  messageId: 'eml_01jexampleexampleexample0@acme.test',
};

function fixture(name: string): Buffer {
  const text = readFileSync(new URL(`./fixtures/bounces/${name}.eml`, import.meta.url), 'utf8')
    .replaceAll('{{RETURN_PATH}}', SENT.returnPath)
    .replaceAll('{{RECIPIENT}}', SENT.to)
    .replaceAll('{{MESSAGE_ID}}', SENT.messageId)
    .replaceAll('{{FROM}}', SENT.from)
    .replaceAll('{{FROM_DOMAIN}}', 'acme.test')
    .replaceAll('{{SUBJECT}}', 'Hello')
    .replace(/\r?\n/g, '\r\n');
  return Buffer.from(text);
}

const ONLY_TO = { to: SENT.to, copies: [] };

describe('return-path tokens', () => {
  it('round-trips an email id, case-insensitively, within the 64-character local part', () => {
    const id = newId('eml');
    const address = paths.address(id, returnPathHost('Acme.Test', true, 'bounce.example'));
    expect(address).toMatch(/^b\+[0-9a-z]{42}@bounces\.acme\.test$/);
    expect(address.split('@')[0]!.length).toBeLessThanOrEqual(64);
    expect(paths.verify(address)).toEqual({ emailId: id, host: 'bounces.acme.test' });
    expect(paths.verify(address.toUpperCase())?.emailId).toBe(id);
    expect(returnPathHost('acme.test', false, 'bounce.example')).toBe('bounce.example');
  });

  it('refuses altered, foreign-key, truncated and unrelated addresses', () => {
    const id = newId('eml');
    const address = paths.address(id, 'bounces.acme.test');
    const local = address.split('@')[0]!;
    for (let i = 2; i < local.length; i++) {
      const c = local[i] === 'a' ? 'b' : 'a';
      expect(paths.verify(`${local.slice(0, i)}${c}${local.slice(i + 1)}@bounces.acme.test`)).toBeNull();
    }
    expect(new ReturnPaths(`${SECRET}-other`).verify(address)).toBeNull();
    expect(paths.verify(`${local.slice(0, -1)}@bounces.acme.test`)).toBeNull();
    expect(paths.verify(`${local}x@bounces.acme.test`)).toBeNull();
    for (const bad of ['postmaster@bounces.acme.test', '', '@', `${local}@`, `a@b@${address}`, 'b+@x']) expect(paths.verify(bad)).toBeNull();
  });
});

describe('reading reports', () => {
  it('reads a Postfix DSN: failed 5.1.1 for the recipient, the original Message-ID', async () => {
    const report = await readReport(fixture('postfix-dsn'), '');
    expect(report.content).toEqual({
      kind: 'dsn',
      recipients: [
        {
          action: 'failed',
          status: '5.1.1',
          finalRecipient: SENT.to,
          originalRecipient: SENT.to,
          diagnostic: `550 5.1.1 <${SENT.to}>: Recipient address rejected: User unknown in virtual mailbox table`,
        },
      ],
    });
    expect(report.originalMessageId).toBe(SENT.messageId);
    expect(report.loop).toBe(false);
    expect(verdictOf(report, ONLY_TO)).toMatchObject({ type: 'bounced', bounceType: 'hard' });
  });

  it('reads an Exim DSN (5.0.0 with the remote 5.1.1 kept) and its delay warning', async () => {
    const failed = await readReport(fixture('exim-dsn'), '');
    expect(failed.originalMessageId).toBe(SENT.messageId);
    expect(verdictOf(failed, ONLY_TO)).toEqual({ type: 'bounced', bounceType: 'hard', diagnostic: '5.0.0 550 5.1.1 No such user here' });
    const delayed = await readReport(fixture('exim-delayed'), '');
    expect(verdictOf(delayed, ONLY_TO)).toEqual({ type: 'delayed', diagnostic: '451 4.7.1 Greylisted, please try again later' });
  });

  it('reads a 4.x.x failure as a soft bounce, and delivered/relayed actions as nothing', async () => {
    const soft = fixture('postfix-dsn').toString().replace('Status: 5.1.1', 'Status: 4.2.2').replace(/550 5\.1\.1/g, '452 4.2.2');
    expect(verdictOf(await readReport(Buffer.from(soft), ''), ONLY_TO)).toMatchObject({ type: 'bounced', bounceType: 'soft' });
    const relayed = fixture('postfix-dsn').toString().replace('Action: failed', 'Action: relayed');
    expect(verdictOf(await readReport(Buffer.from(relayed), ''), ONLY_TO)).toMatchObject({ type: 'ignored' });
  });

  it('applies a DSN to the recipient it names: the `to`, a copy recipient, or none of the email’s (ignored)', async () => {
    const aboutCopy = fixture('postfix-dsn').toString().replaceAll(SENT.to, 'copy@example.com');
    const report = await readReport(Buffer.from(aboutCopy), '');
    expect(verdictOf(report, { to: SENT.to, copies: ['other@example.com'] })).toMatchObject({ type: 'ignored' });
    expect(verdictOf(report, { to: SENT.to, copies: ['other@example.com', 'copy@example.com'] })).toMatchObject({ type: 'bounced', bounceType: 'hard', copy: 'copy@example.com' });
    expect(verdictOf(await readReport(fixture('postfix-dsn'), ''), { to: SENT.to, copies: ['copy@example.com'] })).not.toHaveProperty('copy');
    // Without copies the only recipient is the `to`, whatever address the remote names (forwarding).
    expect(verdictOf(report, ONLY_TO)).toMatchObject({ type: 'bounced' });
  });

  it('reads Yahoo and Microsoft ARF reports as complaints; other feedback types as nothing', async () => {
    for (const name of ['yahoo-arf', 'microsoft-arf']) {
      const report = await readReport(fixture(name), 'feedback@reports.example');
      expect(report.content).toMatchObject({ kind: 'arf', feedbackType: 'abuse' });
      expect(report.originalMessageId).toBe(SENT.messageId);
      expect(verdictOf(report, ONLY_TO)).toMatchObject({ type: 'complained' });
    }
    const notSpam = fixture('yahoo-arf').toString().replace('Feedback-Type: abuse', 'Feedback-Type: not-spam');
    expect(verdictOf(await readReport(Buffer.from(notSpam), ''), ONLY_TO)).toMatchObject({ type: 'ignored' });
  });

  it('reads a Gmail-style unstructured bounce; an auto-reply that is not from a mailer-daemon is ignored', async () => {
    const report = await readReport(fixture('gmail-unstructured'), '');
    expect(report.content).toMatchObject({ kind: 'unstructured', fromDaemon: true, status: '5.1.1' });
    expect(verdictOf(report, ONLY_TO)).toMatchObject({ type: 'bounced', bounceType: 'hard', diagnostic: expect.stringContaining('550 5.1.1') });
    const reply = Buffer.from(`From: Jane <jane@example.com>\r\nTo: ${SENT.returnPath}\r\nSubject: Out of office\r\n\r\nI am away until Monday; 550 reasons.\r\n`);
    expect(verdictOf(await readReport(reply, 'jane@example.com'), ONLY_TO)).toMatchObject({ type: 'ignored' });
    // RFC 3834 auto-replies come with a null envelope sender too (Exchange's out-of-office, a
    // Sieve vacation): from the person, not a mailer-daemon, they are no bounce.
    const outOfOffice = Buffer.from(
      `From: Ooo Three <ooo3@example.org>\r\nTo: ${SENT.returnPath}\r\nSubject: Automatic reply: news\r\nAuto-Submitted: auto-generated\r\nX-Auto-Response-Suppress: All\r\n\r\n` +
        `I am on leave until 1 December.\r\n\r\nAcme Customer Corp. | 550 Market Street, San Francisco\r\n`,
    );
    expect(verdictOf(await readReport(outOfOffice, ''), ONLY_TO)).toMatchObject({ type: 'ignored' });
    const vacation = Buffer.from(`From: ooo1@example.org\r\nSubject: Away\r\nAuto-Submitted: auto-replied (vacation)\r\n\r\nBack soon.\r\n`);
    expect(verdictOf(await readReport(vacation, ''), ONLY_TO)).toMatchObject({ type: 'ignored' });
    // Responders that set no Auto-Submitted, known by their own marks or their subject.
    for (const marks of ['X-Autoreply: yes\r\nSubject: Re: news', 'Precedence: auto_reply\r\nSubject: Re: news', 'Subject: Out of Office: news', 'Subject: Automatic reply: news']) {
      const reply = Buffer.from(`From: Ann <ann@example.org>\r\n${marks}\r\n\r\nAway. 550 Market Street\r\n`);
      expect(verdictOf(await readReport(reply, ''), ONLY_TO), marks).toMatchObject({ type: 'ignored' });
    }
    // A daemon known by its name, its Exchange mailbox, with no domain, no From at all, or only
    // by its null sender (a From no list knows, no auto-reply mark): still a bounce.
    for (const from of [
      'From: Mail Delivery Subsystem <bounces-handler@mx.example>\r\n',
      'From: Microsoft Outlook <MicrosoftExchange329e71ec88ae4615bbc36ab6ce41109e@contoso.example>\r\n',
      'From: MAILER-DAEMON\r\n',
      '',
      'From: "Courier mail server at mx.example" <@>\r\n',
      'From: Mail Robot <robot@mx.example>\r\n',
    ]) {
      const daemon = Buffer.from(`${from}Subject: failure\r\n\r\nremote said: 550 no such user\r\n`);
      expect(verdictOf(await readReport(daemon, ''), ONLY_TO), from).toMatchObject({ type: 'bounced', bounceType: 'hard' });
    }
    // The same from a person's envelope sender is no bounce.
    const personal = Buffer.from(`From: Mail Robot <robot@mx.example>\r\nSubject: failure\r\n\r\nremote said: 550 no such user\r\n`);
    expect(verdictOf(await readReport(personal, 'robot@mx.example'), ONLY_TO)).toMatchObject({ type: 'ignored' });
    const bare550 = Buffer.from(`From: Mail Delivery System <MAILER-DAEMON@mx.example>\r\nSubject: failure\r\n\r\nremote said: 550 no such user\r\n`);
    expect(verdictOf(await readReport(bare550, ''), ONLY_TO)).toMatchObject({ type: 'bounced', bounceType: 'hard', diagnostic: 'remote said: 550 no such user' });
  });

  it('reads a multipart report whose parts cannot be found (no boundary, or one never used) as unreadable, not as an unstructured bounce', async () => {
    const report = (contentType: string) =>
      Buffer.from(
        [
          'From: MAILER-DAEMON@mx.example.net',
          `To: ${SENT.returnPath}`,
          'Subject: Undelivered',
          'MIME-Version: 1.0',
          `Content-Type: ${contentType}`,
          '',
          '--X',
          'Content-Type: message/delivery-status',
          '',
          `Final-Recipient: rfc822; ${SENT.to}`,
          'Action: failed',
          'Status: 5.1.1',
          '',
          '--X--',
          '',
        ].join('\r\n'),
      );
    for (const type of ['multipart/report; report-type=delivery-status', 'multipart/report; report-type=delivery-status; boundary="NOPE"', 'multipart/mixed']) {
      const read = await readReport(report(type), '');
      expect(read.content, type).toMatchObject({ kind: 'unreadable', reason: expect.stringContaining('malformed MIME') });
      expect(verdictOf(read, ONLY_TO), type).toMatchObject({ type: 'ignored' });
    }
    // The same with its boundary is a DSN.
    expect((await readReport(report('multipart/report; report-type=delivery-status; boundary="X"'), '')).content).toMatchObject({ kind: 'dsn' });
  });

  it('reads the status of an unstructured bounce in its own words, not in the copy of the message it quotes', async () => {
    const notice = (separator: string, quoted: string) =>
      Buffer.from(
        `From: MAILER-DAEMON@mail.isp.example\r\nTo: ${SENT.returnPath}\r\nSubject: failure notice\r\n\r\n` +
          `I tried to deliver a message to <reader@example.com>, but the remote host is temporarily unavailable.\r\n` +
          `Remote host said: 451 4.3.0 Temporary system failure. Please try again later.\r\n\r\n${separator}\r\n\r\n${quoted}\r\n`,
      );
    const copies = [
      ['--- Below this line is a copy of the message.', `Message-ID: <${SENT.messageId}>\r\nSubject: Weekly news\r\n\r\nUpgrade to version 5.2.1 now`],
      ['------ This is a copy of the message, including all the headers. ------', 'Subject: Call 550\r\n\r\nCall 550 for the office'],
      ['----- Original message -----', 'Subject: Release 5.2.1\r\n\r\nHello'],
      ['', `Received: from mx.acme.test\r\nSubject: Release 5.2.1\r\n\r\nHello`],
    ];
    for (const [separator, quoted] of copies) {
      const verdict = verdictOf(await readReport(notice(separator!, quoted!), ''), ONLY_TO);
      expect(verdict, separator).toMatchObject({ type: 'bounced', bounceType: 'soft', diagnostic: 'Remote host said: 451 4.3.0 Temporary system failure. Please try again later.' });
    }
    // A hard status in the bounce's own words stays hard, whatever the copy holds.
    const hard = Buffer.from(`From: MAILER-DAEMON@mx.example\r\nSubject: failure\r\n\r\nRemote host said: 550 5.1.1 no such user\r\n\r\n--- Below this line is a copy of the message.\r\n\r\nSubject: 4.2.2\r\n`);
    expect(verdictOf(await readReport(hard, ''), ONLY_TO)).toMatchObject({ type: 'bounced', bounceType: 'hard', diagnostic: 'Remote host said: 550 5.1.1 no such user' });
  });

  it('finds the quoted copy of an unstructured bounce in linear time', async () => {
    const text = `${'-'.repeat(60_000)}\r\n${' -'.repeat(2_000)}x`;
    const started = performance.now();
    await readReport(Buffer.from(`From: MAILER-DAEMON@mx.example\r\nSubject: x\r\n\r\n${text}\r\n`), '');
    expect(performance.now() - started).toBeLessThan(2_000);
  });

  it('ignores an unstructured bounce of an email with copies: it names none of its recipients (docs/outcomes.md)', async () => {
    const report = await readReport(fixture('gmail-unstructured'), '');
    expect(verdictOf(report, { to: SENT.to, copies: ['copy@example.com'] })).toMatchObject({ type: 'ignored' });
  });

  it('reads field blocks in linear time, whatever the input', () => {
    const hostile = [':'.repeat(2_000_000), ' a'.repeat(1_000_000), `${'x:'.repeat(500_000)}\n`.repeat(2), '\n \t\n'.repeat(200_000)].join('\n');
    const started = performance.now();
    const blocks = parseFieldBlocks(hostile);
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(blocks.length).toBeLessThanOrEqual(100);
  });

  it('scans a worst-case unstructured bounce of the maximum text size quickly', async () => {
    const text = `${'5.5.5.5.5.4.4'.repeat(6_000)} 12345550`.slice(0, 80_000);
    const raw = Buffer.from(`From: MAILER-DAEMON@mx.example\r\nSubject: x\r\n\r\n${text}\r\n`);
    const started = performance.now();
    const report = await readReport(raw, '');
    expect(performance.now() - started).toBeLessThan(2_000);
    expect(report.content.kind).toBe('unstructured');
  });
});

describe('the direct DSN reader', () => {
  it('reads the DSN fixtures exactly as mailparser’s parts read them', async () => {
    for (const name of ['postfix-dsn', 'exim-dsn', 'exim-delayed']) {
      const raw = fixture(name);
      const direct = readDsnDirectly(raw);
      expect(direct, name).toBeDefined();
      expect(direct, name).toEqual(await readWithMailparser(raw, ''));
      expect(direct?.content.kind, name).toBe('dsn');
    }
  });

  it('leaves to mailparser what it does not read: ARF, unstructured, encoded parts, no closing delimiter', async () => {
    expect(readDsnDirectly(fixture('yahoo-arf'))).toBeUndefined();
    expect(readDsnDirectly(fixture('gmail-unstructured'))).toBeUndefined();
    const postfix = fixture('postfix-dsn').toString();
    const encoded = postfix.replace('Content-Type: message/delivery-status', 'Content-Type: message/delivery-status\r\nContent-Transfer-Encoding: quoted-printable');
    expect(encoded).not.toBe(postfix);
    expect(readDsnDirectly(Buffer.from(encoded))).toBeUndefined();
    const unclosed = postfix.replace(/--7D1C21A0B3[^\r]*--\r\n$/, '');
    expect(unclosed).not.toBe(postfix);
    expect(readDsnDirectly(Buffer.from(unclosed))).toBeUndefined();
    // Through readReport, both still read as mailparser reads them.
    expect(await readReport(Buffer.from(encoded), '')).toEqual(await readWithMailparser(Buffer.from(encoded), ''));
  });
});
