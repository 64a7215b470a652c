import { describe, expect, it } from 'vitest';
import { mailyToHtml } from '../src/shared/campaigns/maily.js';
import { fillHtml, fillSubject, fillText, variablesOf } from '../src/shared/campaigns/personalize.js';

const anonymous = variablesOf({ id: 'sub_1', email: 'ann@example.com', name: null, fields: { city: 'Oslo' } }, 'https://x.test/u/t');
const named = variablesOf({ id: 'sub_2', email: 'bo@example.com', name: 'Bo <B>', fields: {} }, 'https://x.test/u/t');

describe('merge tags with a fallback: {{name|there}}', () => {
  it('renders the fallback when the value is empty or unknown, the value otherwise', () => {
    expect(fillText('Hello {{name|there}},', anonymous)).toBe('Hello there,');
    expect(fillText('Hello {{ name | dear reader }},', anonymous)).toBe('Hello dear reader,');
    expect(fillText('Hello {{name|there}},', named)).toBe('Hello Bo <B>,');
    expect(fillText('From {{fields.city|far away}} and {{fields.country|somewhere}}', anonymous)).toBe('From Oslo and somewhere');
    expect(fillSubject('Hi {{name|friend}}', anonymous)).toBe('Hi friend');
    // Without a fallback, as before: empty.
    expect(fillText('Hello {{name}},', anonymous)).toBe('Hello ,');
    expect(fillText('Hello {{name|}},', anonymous)).toBe('Hello ,');
  });

  it('escapes the value in HTML, and keeps the fallback as the template wrote it', () => {
    expect(fillHtml('<p>Hello {{name|there &amp; everywhere}}</p>', anonymous)).toBe('<p>Hello there &amp; everywhere</p>');
    expect(fillHtml('<p>Hello {{name|there}}</p>', named)).toBe('<p>Hello Bo &lt;B&gt;</p>');
    // Percent-encoded in a link target by the markdown renderer.
    expect(fillHtml('<a href="https://x.test/?n=%7B%7Bname|anon%7D%7D">x</a>', anonymous)).toBe('<a href="https://x.test/?n=anon">x</a>');
    // The bar encoded too (marked writes %7C), and an encoded fallback kept encoded for the URL.
    expect(fillHtml('<a href="https://x.test/?c=%7B%7Bfields.country%7Cnone%7D%7D">x</a>', anonymous)).toBe('<a href="https://x.test/?c=none">x</a>');
    expect(fillHtml('<a href="https://x.test/?c=%7B%7Bfields.country%7Cnew%20york%7D%7D">x</a>', anonymous)).toBe('<a href="https://x.test/?c=new%20york">x</a>');
  });

  it('a Maily variable node carries its fallback into the merge tag', () => {
    const html = mailyToHtml({
      type: 'doc',
      content: [{ type: 'paragraph', content: [{ type: 'text', text: 'Hello ' }, { type: 'variable', attrs: { id: 'name', fallback: 'there' } }] }],
    });
    expect(html).toContain('{{name|there}}');
    expect(fillHtml(html, anonymous)).toContain('Hello there');
  });

  it('reads the built-in names in any case (the send check accepts the unsubscribe link in any case), a field as stored', () => {
    expect(fillHtml('<a href="{{Unsubscribe_Url}}">x</a> <a href="%7B%7BUNSUBSCRIBE_URL%7D%7D">y</a>', anonymous)).toBe('<a href="https://x.test/u/t">x</a> <a href="https://x.test/u/t">y</a>');
    expect(fillText('{{NAME|you}} at {{Email}} in {{Fields.city}}, not {{fields.City}}', anonymous)).toBe('you at ann@example.com in Oslo, not ');
  });

  it('stays linear on the worst input of the maximum size (1 MiB of unclosed tags)', () => {
    const worst = '{{name|'.repeat(1) + ' '.repeat(1024 * 1024);
    const many = '{{a| '.repeat(200_000);
    for (const input of [worst, many]) {
      const started = performance.now();
      fillHtml(input, anonymous);
      fillText(input, anonymous);
      expect(performance.now() - started).toBeLessThan(2_000);
    }
  });
});
