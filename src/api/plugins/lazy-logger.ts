import type { FastifyBaseLogger } from 'fastify';

type Bindings = Record<string, unknown>;
type ChildOptions = Parameters<FastifyBaseLogger['child']>[1];
type LogArgs = Parameters<FastifyBaseLogger['info']>;

/**
 * A request logger whose pino child (with the request id) is made on first use. Fastify
 * makes a child logger for every request; a route that logs nothing unless it fails (the
 * tracking pixel and redirect, at thousands of hits a second) need not pay for one.
 * Use as the route option `childLoggerFactory: lazyChildLogger`.
 */
class LazyLogger implements FastifyBaseLogger {
  private made: FastifyBaseLogger | undefined;

  constructor(
    private readonly parent: FastifyBaseLogger,
    private readonly bindings: Bindings,
    private readonly options: ChildOptions,
  ) {}

  private get real(): FastifyBaseLogger {
    return (this.made ??= this.parent.child(this.bindings, this.options));
  }

  get level(): string {
    return this.made?.level ?? this.options?.level ?? this.parent.level;
  }

  set level(level: string) {
    this.real.level = level;
  }

  fatal(...args: LogArgs): void {
    (this.real.fatal as (...a: LogArgs) => void)(...args);
  }
  error(...args: LogArgs): void {
    (this.real.error as (...a: LogArgs) => void)(...args);
  }
  warn(...args: LogArgs): void {
    (this.real.warn as (...a: LogArgs) => void)(...args);
  }
  info(...args: LogArgs): void {
    (this.real.info as (...a: LogArgs) => void)(...args);
  }
  debug(...args: LogArgs): void {
    (this.real.debug as (...a: LogArgs) => void)(...args);
  }
  trace(...args: LogArgs): void {
    (this.real.trace as (...a: LogArgs) => void)(...args);
  }
  silent(...args: LogArgs): void {
    (this.real.silent as (...a: LogArgs) => void)(...args);
  }
  child(bindings: Bindings, options?: ChildOptions): FastifyBaseLogger {
    return this.real.child(bindings, options);
  }
}

export function lazyChildLogger(logger: FastifyBaseLogger, bindings: Bindings, options: ChildOptions): FastifyBaseLogger {
  return new LazyLogger(logger, bindings, options);
}
