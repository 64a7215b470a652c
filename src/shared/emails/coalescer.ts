/**
 * Group commit for many concurrent callers: requests that arrive while `maxParallel`
 * writes are in flight are gathered and handed to `run` together (one statement, one
 * commit), and each caller gets its own result. An idle system adds no delay: the first
 * request is written on the next turn of the event loop.
 */
export class Coalescer<I, R> {
  private pending: { item: I; resolve: (result: R) => void; reject: (error: unknown) => void }[] = [];
  private inFlight = 0;
  private scheduled = false;

  constructor(
    /** Returns one result per item, in order. */
    private readonly run: (items: I[]) => Promise<R[]>,
    private readonly maxParallel = 4,
    private readonly maxItems = 200,
  ) {}

  submit(item: I): Promise<R> {
    return new Promise((resolve, reject) => {
      this.pending.push({ item, resolve, reject });
      this.schedule();
    });
  }

  private schedule(): void {
    if (this.scheduled || this.inFlight >= this.maxParallel || this.pending.length === 0) return;
    this.scheduled = true;
    // Lets callers of the same turn of the event loop join this write.
    setImmediate(() => {
      this.scheduled = false;
      this.flush();
    });
  }

  private flush(): void {
    if (this.inFlight >= this.maxParallel || this.pending.length === 0) return;
    const batch = this.pending.splice(0, this.maxItems);
    this.inFlight++;
    this.run(batch.map((b) => b.item))
      .then(
        (results) => batch.forEach((b, i) => b.resolve(results[i]!)),
        (error: unknown) => batch.forEach((b) => b.reject(error)),
      )
      .finally(() => {
        this.inFlight--;
        this.schedule();
      });
    this.schedule();
  }
}
