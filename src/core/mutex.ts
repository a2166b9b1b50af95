/** A FIFO async lock. Pure (no I/O): `run` queues `fn` behind every earlier holder. */
export class Mutex {
  #tail: Promise<void> = Promise.resolve();

  run<T>(fn: () => Promise<T> | T): Promise<T> {
    const result = this.#tail.then(fn);
    this.#tail = result.then(
      () => undefined,
      () => undefined,
    );
    return result;
  }
}
