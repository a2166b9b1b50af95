// Property-based tests of what the tunnel decodes from its peers and the relay: stream frames (FrameDecoder), control
// messages (decodeTunnelMessage), the datagram path's hellos (parseHello), a circuit's token line and ClientHello
// (lineToken, sniToken), and the kept region's description a restarted agent reads back from its keeper
// (parseKeptDescription). harness/fuzz.ts says how to run them long.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { anyBytes, anyText, decodesOrRefuses, fuzzParams, mutatedBytes, mutatedJson, mutatedText } from '../../../harness/fuzz.ts';
import { lineToken, sniToken, TLS_HANDSHAKE } from './circuit.ts';
import { encodeFrame, FRAME_KIND, FrameDecoder, type FrameKind, MAX_FRAME_PAYLOAD, PEER_ID_LEN } from './frame.ts';
import { HELLO_KEY_LEN, HELLO_LEN, HELLO_SIGNED_LEN, HELLO_SPKI_LEN, MAX_GENERATION, parseHello, writeHello } from './hello.ts';
import { type KeptDescription, parseKeptDescription } from './kept-description.ts';
import { decodeTunnelMessage, type MessageChannel, type TunnelMessage } from './messages.ts';

const hex = (n: number) => fc.stringMatching(new RegExp(`^[0-9a-f]{${n}}$`));
const port = fc.integer({ min: 0, max: 65_535 });
const finite = fc.double({ noNaN: true, noDefaultInfinity: true }).map((x) => (Object.is(x, -0) ? 0 : x));
const u32 = fc.integer({ min: 0, max: 0xffff_ffff });
const pin = hex(64).map((h) => `sha256:${h}`);

const controlMessage: fc.Arbitrary<TunnelMessage> = fc.oneof(
  fc.record({ t: fc.constant('ping' as const), at: finite }),
  fc.record({ t: fc.constant('ping' as const), at: finite, quiet: fc.constant(true as const) }),
  fc.record({ t: fc.constant('pong' as const), at: finite }),
  fc.record({ t: fc.constant('hello' as const) }),
  fc.record({ t: fc.constant('observed' as const), host: fc.string(), port, circuitPort: port }),
  fc.record({ t: fc.constant('circuit' as const), to: pin, n: fc.string() }),
  fc.record({ t: fc.constant('circuit-ready' as const), n: fc.string(), token: hex(32) }),
  fc.record({ t: fc.constant('circuit-refused' as const), n: fc.string(), reason: fc.string() }),
  fc.record({ t: fc.constant('circuit-join' as const), from: pin, token: hex(32) }),
  fc.record({ t: fc.constant('udp-key' as const), id: u32, salt: hex(32), host: fc.string(), port }),
  fc.record({ t: fc.constant('udp-key-ack' as const), id: u32 }),
);
const peerMessage: fc.Arbitrary<TunnelMessage> = fc.record({ t: fc.constantFrom('punch' as const, 'punch-ack' as const), n: fc.string(), host: fc.string(), port });
const utf8 = (v: unknown) => new TextEncoder().encode(JSON.stringify(v) ?? '');
const plain = (v: unknown): unknown => JSON.parse(JSON.stringify(v));

/** decodeTunnelMessage never throws: it returns its refusal, which must carry the code. */
function decodedOrRefused(payload: Uint8Array, channel: MessageChannel): void {
  const r = decodesOrRefuses(() => decodeTunnelMessage(payload, channel), []);
  if (!(r instanceof Error) && !r.ok) assert.equal(r.error.code, 'TUNNEL_MESSAGE_INVALID');
}

test('any payload: decodeTunnelMessage gives a message or a TUNNEL_MESSAGE_INVALID refusal, on either channel', () => {
  const payload = fc.oneof(anyBytes(), anyText.map((s) => new TextEncoder().encode(s)), mutatedJson(fc.oneof(controlMessage, peerMessage)).map(utf8),
    mutatedBytes(fc.oneof(controlMessage, peerMessage).map(utf8)));
  fc.assert(fc.property(payload, fc.constantFrom('control' as const, 'relayed' as const), (p, channel) => decodedOrRefused(p, channel)), fuzzParams());
});

test('round trip: decodeTunnelMessage(JSON of x) is x, on its channel', () => {
  const tagged = fc.oneof(controlMessage.map((m) => ['control', m] as const), peerMessage.map((m) => ['relayed', m] as const));
  fc.assert(fc.property(tagged, ([channel, m]) => {
    assert.deepEqual(decodeTunnelMessage(utf8(m), channel), { ok: true, message: plain(m) });
  }), fuzzParams(200));
});

/** Feeds `bytes` to a decoder in chunks cut at `cuts`; returns the frames, or the FrameError that stopped it. */
function feed(bytes: Uint8Array, cuts: number[], reuse: boolean): { frames: [FrameKind, number[]][]; error?: unknown } {
  const d = new FrameDecoder({ reuse });
  const frames: [FrameKind, number[]][] = [];
  const at = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
  let from = 0;
  try {
    for (const to of [...at, bytes.length]) {
      d.push(bytes.subarray(from, to), (payload, kind) => frames.push([kind, [...payload]]));
      from = to;
    }
  } catch (error) {
    return { frames, error };
  }
  return { frames };
}

const frame = fc.oneof(
  fc.tuple(fc.constantFrom(FRAME_KIND.packet, FRAME_KIND.control), fc.uint8Array({ minLength: 1, maxLength: 300 })),
  fc.tuple(fc.constant(FRAME_KIND.relayedControl), fc.uint8Array({ minLength: PEER_ID_LEN + 1, maxLength: 300 })),
);
const stream = fc.array(frame, { maxLength: 5 });
const encoded = (frames: [FrameKind, Uint8Array][]) => Uint8Array.from(frames.flatMap(([k, p]) => [...encodeFrame(p, k)]));

test('any stream, cut anywhere: FrameDecoder hands out frames or stops with TUNNEL_FRAME_INVALID', () => {
  const bytes = fc.oneof(anyBytes(), mutatedBytes(stream.map(encoded)),
    // a header claiming a big frame, to reach the length checks and the assembly of split payloads
    fc.tuple(fc.integer({ min: 0, max: 255 }), fc.integer({ min: 0, max: 0xffffff }), anyBytes(64)).map(([k, n, rest]) => Uint8Array.from([k, n >> 16, (n >> 8) & 255, n & 255, ...rest])));
  fc.assert(fc.property(bytes, fc.array(fc.nat(), { maxLength: 6 }), fc.boolean(), (b, cuts, reuse) => {
    decodesOrRefuses(() => {
      const { error } = feed(b, cuts, reuse);
      if (error !== undefined) throw error;
    }, ['TUNNEL_FRAME_INVALID']);
  }), fuzzParams());
});

test('round trip: frames encoded then fed in any chunks come out whole and in order', () => {
  fc.assert(fc.property(stream, fc.array(fc.nat(), { maxLength: 6 }), fc.boolean(), (frames, cuts, reuse) => {
    assert.deepEqual(feed(encoded(frames), cuts, reuse), { frames: frames.map(([k, p]) => [k, [...p]]) });
  }), fuzzParams(200));
  assert.ok(MAX_FRAME_PAYLOAD > 300);
});

const hello = fc.record({
  generation: fc.integer({ min: 0, max: MAX_GENERATION - 1 }), derived: fc.boolean(), spki: fc.uint8Array({ minLength: HELLO_SPKI_LEN, maxLength: HELLO_SPKI_LEN }),
  eph: fc.uint8Array({ minLength: HELLO_KEY_LEN, maxLength: HELLO_KEY_LEN }), echo: fc.uint8Array({ minLength: HELLO_KEY_LEN, maxLength: HELLO_KEY_LEN }),
  signature: fc.uint8Array({ minLength: HELLO_LEN - HELLO_SIGNED_LEN, maxLength: HELLO_LEN - HELLO_SIGNED_LEN }),
});
const helloBytes = (h: typeof hello extends fc.Arbitrary<infer T> ? T : never) => {
  const b = writeHello(h.generation, h.spki, h.eph, h.echo, h.derived);
  b.set(h.signature, HELLO_SIGNED_LEN);
  return b;
};

test('any datagram: parseHello gives a hello or helloMalformed, never throws', () => {
  const bytes = fc.oneof(anyBytes(HELLO_LEN + 8), fc.uint8Array({ minLength: HELLO_LEN, maxLength: HELLO_LEN }), mutatedBytes(hello.map(helloBytes)));
  fc.assert(fc.property(bytes, fc.nat(8), (b, offset) => {
    // also at an offset inside a larger buffer, as a receive ring hands datagrams out
    const inRing = new Uint8Array(b.length + offset);
    inRing.set(b, offset);
    const r = decodesOrRefuses(() => parseHello(inRing.subarray(offset)), []);
    if (typeof r !== 'string' && !(r instanceof Error)) assert.ok(r.generation < MAX_GENERATION);
  }), fuzzParams());
});

test('round trip: parseHello(writeHello(x) + signature) is x', () => {
  fc.assert(fc.property(hello, (h) => {
    const r = parseHello(helloBytes(h));
    assert.ok(typeof r !== 'string');
    assert.deepEqual({ generation: r.generation, derived: r.derived, spki: [...r.spki], eph: [...r.eph], echo: [...r.echo], signature: [...r.signature] },
      { generation: h.generation, derived: h.derived, spki: [...h.spki], eph: [...h.eph], echo: [...h.echo], signature: [...h.signature] });
  }), fuzzParams(200));
});

/** A TLS record holding a ClientHello whose server_name is `name`, after `before` other extensions. */
function clientHello(name: Uint8Array, before: Uint8Array[]): Uint8Array {
  const u16 = (n: number) => [n >> 8, n & 255];
  const sni = [0, 0, ...u16(name.length + 5), ...u16(name.length + 3), 0, ...u16(name.length), ...name];
  const exts = [...before.flatMap((e) => [0, 23, ...u16(e.length), ...e]), ...sni];
  const body = [3, 3, ...new Array(32).fill(7), 0, ...u16(2), 0x13, 0x01, 1, 0, ...u16(exts.length), ...exts];
  const hs = [1, 0, ...u16(body.length), ...body];
  return Uint8Array.from([TLS_HANDSHAKE, 3, 1, ...u16(hs.length), ...hs]);
}

test('any bytes: sniToken and lineToken give a token or undefined, never throw; a real ClientHello gives its token', () => {
  const record = fc.tuple(fc.oneof(hex(32).map((t) => `${t}.circuit.atoll`), fc.string()), fc.array(fc.uint8Array({ maxLength: 40 }), { maxLength: 3 }))
    .map(([n, before]) => clientHello(new TextEncoder().encode(n), before));
  fc.assert(fc.property(fc.oneof(anyBytes(), mutatedBytes(record)), anyText, (r, line) => {
    decodesOrRefuses(() => sniToken(r), []);
    decodesOrRefuses(() => lineToken(line), []);
  }), fuzzParams());
  fc.assert(fc.property(hex(32), fc.array(fc.uint8Array({ maxLength: 40 }), { maxLength: 3 }), (token, before) => {
    assert.equal(sniToken(clientHello(new TextEncoder().encode(`${token}.circuit.atoll`), before)), token);
    assert.equal(lineToken(`${token}\n`), token);
  }), fuzzParams(100));
});

const keyRef = <K extends string>(at: K) => fc.record({ slot: fc.nat(), id: u32, [at]: finite } as Record<'slot' | 'id' | K, fc.Arbitrary<number>>);
const keptPeer = fc.record({
  id: fc.string({ minLength: 1 }), pin: fc.string(), endpoint: fc.string(), announced: fc.record({ host: fc.string(), port }), usable: fc.boolean(), heard: finite,
  send: keyRef('createdAt'), pending: keyRef('at'), recv: fc.array(fc.record({ slot: fc.nat(), id: u32, expiresAt: fc.option(finite, { nil: null }) }), { maxLength: 3 }),
}, { requiredKeys: ['id', 'pin', 'usable', 'recv'] });
const kept = fc.record({ v: fc.constant(1 as const), peers: fc.uniqueArray(keptPeer, { selector: (p) => p.id, maxLength: 4 }) });

test('any text: parseKeptDescription gives a description or undefined, never throws', () => {
  fc.assert(fc.property(fc.oneof(anyText, mutatedJson(kept).map((v) => JSON.stringify(v) ?? ''), mutatedText(kept.map((k) => JSON.stringify(k)))), (text) => {
    decodesOrRefuses(() => parseKeptDescription(text), []);
  }), fuzzParams());
});

test('round trip: parseKeptDescription(JSON.stringify(x)) is x', () => {
  fc.assert(fc.property(kept, (k) => {
    assert.deepEqual(parseKeptDescription(JSON.stringify(k)), plain(k) as KeptDescription);
  }), fuzzParams(200));
});
