/**
 * Whether an error means PostgreSQL or Redis cannot be reached (as opposed to a bug or a
 * bad query). The API answers these 503 and workers back off instead of failing the job.
 */
export function isDependencyDown(error: unknown): boolean {
  let current: unknown = error;
  for (let depth = 0; current && depth < 5; depth++) {
    const e = current as { name?: string; code?: string; message?: string; cause?: unknown };
    if (e.name === 'ConnectionException' || e.name === 'KnexTimeoutError' || e.name === 'MaxRetriesPerRequestError') return true;
    if (e.code && CONNECTION_CODES.has(e.code)) return true;
    // SQLSTATE class 08: connection exception; but 08P01 (protocol violation) is the server
    // refusing one malformed message (e.g. a NUL in a text parameter) on a working connection.
    if (typeof e.code === 'string' && e.code.startsWith('08') && e.code !== '08P01') return true;
    if (e.message && CONNECTION_MESSAGES.test(e.message)) return true;
    current = e.cause;
  }
  return false;
}

const CONNECTION_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EPIPE',
  'EHOSTUNREACH',
  'ENOTCONN',
  '57P01', // admin_shutdown
  '57P02', // crash_shutdown
  '57P03', // cannot_connect_now
  // invalid_catalog_name: the database of DATABASE_URL does not exist (mistyped, or not made yet
  // by `migrate`): nothing can be done until it does, as when the server is down (/readyz says so).
  '3D000',
]);

// `timeout expired`: pg's connect timeout (connectionTimeoutMillis) on a host that accepts the
// connection and never answers.
const CONNECTION_MESSAGES =
  /^timeout expired$|enableOfflineQueue|Connection is closed|Command timed out|Connection terminated|connection timeout|timeout exceeded when trying to connect|Knex: Timeout acquiring a connection|Client has encountered a connection error|the database system is (starting up|shutting down)/i;
