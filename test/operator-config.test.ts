import { describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../src/shared/config.js';

describe('configuration of the operator essentials', () => {
  it('PUBLIC_URL follows PORT unless set', () => {
    expect(loadConfig({}).publicUrl).toBe('http://localhost:3000');
    expect(loadConfig({ PORT: '8080' }).publicUrl).toBe('http://localhost:8080');
    expect(loadConfig({ PORT: '8080', PUBLIC_URL: 'https://mail.example.com/' }).publicUrl).toBe('https://mail.example.com');
  });

  it('SYSTEM_FROM: set, or no-reply@ a real host name, never an IP address', () => {
    expect(loadConfig({ PUBLIC_URL: 'https://mail.example.com' }).systemFrom).toBe('no-reply@mail.example.com');
    expect(loadConfig({ PUBLIC_URL: 'http://127.0.0.1:3000' }).systemFrom).toBe('no-reply@localhost.localdomain');
    expect(loadConfig({ PUBLIC_URL: 'http://[::1]:3000' }).systemFrom).toBe('no-reply@localhost.localdomain');
    expect(loadConfig({}).systemFrom).toBe('no-reply@localhost.localdomain');
    expect(loadConfig({ PUBLIC_URL: 'http://127.0.0.1:3000', SYSTEM_FROM: 'hello@news.example.org' }).systemFrom).toBe('hello@news.example.org');
    expect(() => loadConfig({ SYSTEM_FROM: 'not an address' })).toThrow(/SYSTEM_FROM: expected an address/);
  });

  it('EMAIL_RETENTION_DAYS defaults to 30 and must be a whole number of days, at least 1', () => {
    expect(loadConfig({}).emailRetentionDays).toBe(30);
    expect(loadConfig({ EMAIL_RETENTION_DAYS: '90' }).emailRetentionDays).toBe(90);
    for (const bad of ['0', '-3', '1.5', 'forever']) {
      expect(() => loadConfig({ EMAIL_RETENTION_DAYS: bad }), bad).toThrow(ConfigError);
      expect(() => loadConfig({ EMAIL_RETENTION_DAYS: bad }), bad).toThrow(/EMAIL_RETENTION_DAYS/);
    }
  });
});
