import { test } from 'node:test';
import assert from 'node:assert/strict';
import { lowerBound } from './sorted.ts';

test('lowerBound: the first index not below the key', () => {
  const keys = ['/a/1', '/a/2', '/a/2', '/a/2', '/b/1', '/c'];
  const cases: [string, readonly string[], string, number][] = [
    ['empty', [], 'x', 0],
    ['before the first', keys, '/', 0],
    ['the first itself', keys, '/a/1', 0],
    ['between two', keys, '/a/10', 1],
    ['equal elements: the first of them', keys, '/a/2', 1],
    ['a prefix: the first key starting with it', keys, '/b/', 4],
    ['the last itself', keys, '/c', 5],
    ['after the last', keys, '/d', 6],
    ['one element, below it', ['m'], 'a', 0],
    ['one element, above it', ['m'], 'z', 1],
    ['by code unit, not locale: capitals first', ['B', 'a', 'b'], 'a', 1],
  ];
  for (const [name, sorted, key, want] of cases) assert.equal(lowerBound(sorted, key), want, name);
});

test('lowerBound agrees with a linear scan on every key of a sorted array and between them', () => {
  const sorted = ['', 'a', 'a', 'ab', 'b', 'é', '\u{1F600}'].sort();
  for (const key of [...sorted, ' ', 'aa', 'az', 'c', 'zz', '\uffff']) {
    const linear = sorted.findIndex((s) => !(s < key));
    assert.equal(lowerBound(sorted, key), linear < 0 ? sorted.length : linear, JSON.stringify(key));
  }
});
