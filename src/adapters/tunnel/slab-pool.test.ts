import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SlabPool } from './slab-pool.ts';

/** A piece of `size` bytes, claimed whole. */
const take = (pool: SlabPool, size: number) => pool.commit(pool.region(0, size), size);

test('slab pool: pieces come out of one slab in order, with their headroom in front', () => {
  const pool = new SlabPool({ slabSize: 100, keep: 4 });
  const r = pool.region(4, 30);
  r.fill(7, 0, 10);
  const a = pool.commit(r, 10);
  const b = take(pool, 20);
  assert.equal(a.buffer, b.buffer, 'the same slab');
  assert.equal(a.byteOffset, 4, 'the headroom lies in front');
  assert.equal(b.byteOffset, 14, 'the next piece starts where the claimed bytes end, not where the region did');
  assert.deepEqual([...a], Array(10).fill(7));
  assert.equal(pool.out, 2);
});

test('slab pool: a full slab is reused only once every piece of it came back', () => {
  const pool = new SlabPool({ slabSize: 100, keep: 4 });
  const [a1, a2] = [take(pool, 40), take(pool, 40)]; // slab 1
  const [b1, b2] = [take(pool, 40), take(pool, 40)]; // does not fit: slab 2
  assert.notEqual(b1.buffer, a1.buffer);
  assert.equal(b2.buffer, b1.buffer);
  pool.release(a1);
  const c1 = take(pool, 40); // slab 2 is full, slab 1 has a piece out: slab 3
  assert.ok(c1.buffer !== a1.buffer && c1.buffer !== b1.buffer);
  pool.release(a2); // slab 1 all back
  take(pool, 40);
  const d1 = take(pool, 40); // slab 3 full: slab 1 is reused, no fourth slab
  assert.equal(d1.buffer, a1.buffer);
  assert.equal(pool.out, 5);
});

test('slab pool: pieces of unpooled slabs and foreign buffers are ignored on release; oversized asks refused', () => {
  const pool = new SlabPool({ slabSize: 100, keep: 1 });
  take(pool, 80);
  const unpooled = take(pool, 80); // a second slab, beyond `keep`: not pooled
  pool.release(unpooled);
  pool.release(Buffer.alloc(10));
  assert.equal(pool.out, 1, 'only the pooled slab counts');
  assert.throws(() => pool.region(10, 95), RangeError);
});
