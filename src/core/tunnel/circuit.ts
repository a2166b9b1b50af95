/**
 * How a node's connection to the relay's circuit port names its circuit (src/relay/circuits.ts). Pure: no I/O.
 *
 * A circuit token is 128 random bits in 32 lowercase hex digits. The end that runs TLS as the server sends it first,
 * as a line; the end that runs TLS as the client sends it as the server name of its ClientHello
 * (`<token>.circuit.atoll`), which the relay reads and passes on unchanged.
 */

/** A token line: 32 hex digits and a newline. */
export const TOKEN_LINE_LEN = 33;
/** The server name a TLS client end sends: `<token>.` and this. */
export const CIRCUIT_SNI_SUFFIX = 'circuit.atoll';
/** The first byte of a TLS handshake record (a ClientHello). */
export const TLS_HANDSHAKE = 0x16;

/** The server name a TLS client end of the circuit `token` sends. */
export function circuitServerName(token: string): string {
  return `${token}.${CIRCUIT_SNI_SUFFIX}`;
}

/** The token of a token line (with its newline), or undefined when it is not one. */
export function lineToken(line: string): string | undefined {
  const m = /^([0-9a-f]{32})\n$/.exec(line);
  return m ? m[1] : undefined;
}

/**
 * The token a TLS client end put in its ClientHello as the server name (`<token>.circuit.atoll`), or undefined.
 * `record`: one TLS record (5-byte header, then a handshake message), as read from the connection.
 */
export function sniToken(record: Uint8Array): string | undefined {
  const name = serverName(record);
  const m = name === undefined ? null : /^([0-9a-f]{32})\.(.+)$/.exec(name);
  return m && m[2] === CIRCUIT_SNI_SUFFIX ? m[1] : undefined;
}

/** The host_name of the server_name extension of a ClientHello record (RFC 8446 4.1.2, RFC 6066 3), if any. */
function serverName(r: Uint8Array): string | undefined {
  const u16 = (at: number) => ((r[at] ?? 0) << 8) | (r[at + 1] ?? 0);
  if (r[0] !== TLS_HANDSHAKE || r[5] !== 1) return undefined; // a handshake record holding a ClientHello
  let at = 5 + 4 + 2 + 32; // handshake header, legacy_version, random
  at += 1 + (r[at] ?? 0); // legacy_session_id
  at += 2 + u16(at); // cipher_suites
  at += 1 + (r[at] ?? 0); // legacy_compression_methods
  const end = Math.min(r.length, at + 2 + u16(at));
  at += 2;
  while (at + 4 <= end) {
    const type = u16(at);
    const len = u16(at + 2);
    at += 4;
    if (type === 0 && at + 5 <= end) {
      // server_name_list: length, then entries of name_type (0 = host_name), length, name
      const nameLen = u16(at + 3);
      if (r[at + 2] !== 0 || at + 5 + nameLen > end) return undefined;
      return String.fromCharCode(...r.subarray(at + 5, at + 5 + nameLen));
    }
    at += len;
  }
  return undefined;
}
