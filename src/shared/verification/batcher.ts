/**
 * Group commit for the hot path: calls made in the same turn of the event loop (up to
 * `maxBatch`) are flushed together by one statement, and each caller gets its own answer
 * when that statement has committed. Nothing is answered before its row is written.
 */
export class MicroBatcher<I, O> {
  private pending: Array<{ item: I; resolve: (o: O) => void; reject: (e: unknown) => void }> = [];
  private scheduled = false;

  constructor(
    private readonly flush: (items: I[]) => Promise<O[]>,
    private readonly maxBatch = 256,
  ) {}

  run(item: I): Promise<O> {
    return new Promise<O>((resolve, reject) => {
      this.pending.push({ item, resolve, reject });
      if (this.pending.length >= this.maxBatch) this.drain();
      else if (!this.scheduled) {
        this.scheduled = true;
        setImmediate(() => this.drain());
      }
    });
  }

  private drain(): void {
    this.scheduled = false;
    const batch = this.pending.splice(0);
    if (batch.length === 0) return;
    this.flush(batch.map((b) => b.item)).then(
      (out) => batch.forEach((b, i) => b.resolve(out[i]!)),
      (error: unknown) => batch.forEach((b) => b.reject(error)),
    );
  }
}
