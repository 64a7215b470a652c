import dns2 from 'dns2';

const { Packet } = dns2;

/** What one name answers. A name absent from the zone is NXDOMAIN; a type absent is NODATA. */
export interface FixtureRecords {
  a?: string[];
  aaaa?: string[];
  /** `{ priority: 0, exchange: '' }` publishes a null MX (`0 .`). */
  mx?: Array<{ priority: number; exchange: string }>;
  /** One string per TXT record; long ones are split into 255-byte character-strings. */
  txt?: string[];
  ttl?: number;
  nxdomain?: boolean;
  servfail?: boolean;
  /** Never answer (the client times out). */
  drop?: boolean;
}

export type FixtureZone = Record<string, FixtureRecords>;

export interface TestDnsServer {
  host: string;
  port: number;
  /** `127.0.0.1:port`, as DNS_SERVERS takes it. */
  address: string;
  set(name: string, records: FixtureRecords): void;
  remove(name: string): void;
  /** Queries received, optionally for one name and/or type (`A`, `MX`, `TXT`, ...). */
  count(name?: string, type?: string): number;
  resetCounts(): void;
  close(): Promise<void>;
}

// RFC 1035 4.1.1 (the typings of dns2 omit Packet.RCODE).
const RCODE_SERVFAIL = 2;
const RCODE_NXDOMAIN = 3;

const TYPE_NAMES: Record<number, string> = { 1: 'A', 15: 'MX', 16: 'TXT', 28: 'AAAA' };

function chunks(value: string): string[] {
  const bytes = Buffer.from(value, 'utf8');
  const parts: string[] = [];
  for (let i = 0; i < bytes.length; i += 255) parts.push(bytes.subarray(i, i + 255).toString('utf8'));
  return parts.length ? parts : [''];
}

/**
 * A real DNS server on 127.0.0.1 (UDP and TCP on one port, so truncated answers such as a
 * 2048-bit DKIM key can be retried over TCP) serving zones the test controls.
 */
export async function startDnsServer(initial: FixtureZone = {}): Promise<TestDnsServer> {
  const zone = new Map<string, FixtureRecords>(Object.entries(initial).map(([k, v]) => [k.toLowerCase(), v]));
  const received: Array<{ name: string; type: string }> = [];

  const handle: dns2.DnsHandler = (request, send) => {
    const response = Packet.createResponseFromRequest(request);
    const [question] = request.questions;
    if (!question) return void send(response);
    const name = question.name.toLowerCase().replace(/\.$/, '');
    const type = TYPE_NAMES[question.type] ?? String(question.type);
    received.push({ name, type });
    const records = zone.get(name);
    if (records?.drop) return;
    if (!records || records.nxdomain) {
      response.header.rcode = RCODE_NXDOMAIN;
      return void send(response);
    }
    if (records.servfail) {
      response.header.rcode = RCODE_SERVFAIL;
      return void send(response);
    }
    const ttl = records.ttl ?? 300;
    const base = { name: question.name, class: Packet.CLASS.IN, ttl };
    if (type === 'A') for (const address of records.a ?? []) response.answers.push({ ...base, type: Packet.TYPE.A, address } as never);
    if (type === 'AAAA') for (const address of records.aaaa ?? []) response.answers.push({ ...base, type: Packet.TYPE.AAAA, address } as never);
    if (type === 'MX') for (const mx of records.mx ?? []) response.answers.push({ ...base, type: Packet.TYPE.MX, ...mx } as never);
    if (type === 'TXT') for (const text of records.txt ?? []) response.answers.push({ ...base, type: Packet.TYPE.TXT, data: chunks(text) } as never);
    void send(response);
  };

  for (let attempt = 0; ; attempt++) {
    const udp = dns2.createUDPServer({ type: 'udp4' });
    const tcp = dns2.createTCPServer(handle);
    udp.on('request', handle);
    for (const s of [udp, tcp]) s.on('requestError', () => {});
    await new Promise<void>((resolve) => udp.bind(0, '127.0.0.1', () => resolve()));
    const port = udp.address().port;
    const tcpOk = await new Promise<boolean>((resolve) => {
      tcp.once('error', () => resolve(false));
      tcp.listen(port, '127.0.0.1', () => resolve(true));
    });
    if (!tcpOk) {
      udp.close();
      if (attempt < 5) continue;
      throw new Error('could not bind TCP and UDP on one port');
    }
    return {
      host: '127.0.0.1',
      port,
      address: `127.0.0.1:${port}`,
      set(name, records) {
        zone.set(name.toLowerCase(), records);
      },
      remove(name) {
        zone.delete(name.toLowerCase());
      },
      count(name, type) {
        return received.filter((q) => (name === undefined || q.name === name.toLowerCase()) && (type === undefined || q.type === type)).length;
      },
      resetCounts() {
        received.length = 0;
      },
      async close() {
        await new Promise<void>((resolve) => udp.close(() => resolve()));
        await new Promise<void>((resolve) => tcp.close(() => resolve()));
      },
    };
  }
}

/** Publishes the records a domain hands out (`dnsRecords` of the API), each name's TXT and MX together. */
export function publishDomainRecords(dns: TestDnsServer, records: ReadonlyArray<{ type: string; name: string; value: string; priority: number | null }>): void {
  const byName = new Map<string, { txt: string[]; mx: Array<{ priority: number; exchange: string }> }>();
  for (const record of records) {
    const entry = byName.get(record.name) ?? { txt: [], mx: [] };
    if (record.type === 'TXT') entry.txt.push(record.value);
    else entry.mx.push({ priority: record.priority ?? 10, exchange: record.value });
    byName.set(record.name, entry);
  }
  for (const [name, entry] of byName) dns.set(name, { ...entry, ttl: 300 });
}
