import { startSmtpSink } from '../test/helpers/smtp-sink.js';

// A local SMTP sink in a process of its own, so it does not share a core with what is
// measured. Reports its URL, then answers "count" with the messages accepted so far, and
// reports the time a recipient starting with `probe` is given (bench:backlog).
const sink = await startSmtpSink({ parse: false });
sink.answer = (recipient) => {
  if (recipient.startsWith('probe')) process.send?.({ probe: recipient, at: Date.now() });
  return undefined;
};
process.send?.({ url: sink.url });
process.on('message', (message) => {
  if (message === 'count') process.send?.({ count: sink.accepted });
  if (message === 'stop') void sink.close().then(() => process.exit(0));
});
