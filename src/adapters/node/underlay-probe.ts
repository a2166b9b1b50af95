/**
 * Direct-reachability probes between nodes' underlay addresses, for site detection. Each agent answers UDP probes
 * on its underlay address; the answer carries the source address the responder saw. A peer counts as directly
 * reachable only if it answered from the address probed AND saw us under our own underlay address: a NAT in
 * between (an edge node reaching a cloud node through its site router) fails the second test.
 */
import { createSocket, type Socket } from 'node:dgram';
import { randomBytes } from 'node:crypto';

const MAGIC = 'ATLP1';

export class ProbeResponder {
  #sock: Socket | undefined;

  /** Answers probes on `address:port`. */
  async start(address: string, port: number): Promise<void> {
    const sock = createSocket({ type: 'udp4', reuseAddr: true });
    sock.on('message', (msg, rinfo) => {
      const text = msg.toString('latin1');
      if (!text.startsWith(`${MAGIC} `) || msg.length > 64) return;
      sock.send(`${text} ${rinfo.address}`, rinfo.port, rinfo.address);
    });
    await new Promise<void>((resolve, reject) => {
      sock.once('error', reject);
      sock.bind(port, address, () => resolve());
    });
    sock.on('error', () => {});
    this.#sock = sock;
  }

  stop(): void {
    this.#sock?.close();
    this.#sock = undefined;
  }
}

export interface ProbeResult {
  readonly reachable: boolean;
  readonly rttMs?: number;
}

/** Probes `target:port` from `self` (our underlay address), `tries` times, each waiting `timeoutMs`. */
export function probeDirect(self: string, target: string, port: number, timeoutMs = 300, tries = 3): Promise<ProbeResult> {
  return new Promise((resolve) => {
    const sock = createSocket('udp4');
    const nonce = randomBytes(8).toString('hex');
    let sent = 0;
    let started = 0;
    let timer: NodeJS.Timeout | undefined;
    const finish = (r: ProbeResult) => {
      clearTimeout(timer);
      sock.close();
      resolve(r);
    };
    const send = () => {
      if (sent++ >= tries) return finish({ reachable: false });
      started = performance.now();
      sock.send(`${MAGIC} ${nonce}`, port, target, (err) => {
        if (err) finish({ reachable: false });
      });
      timer = setTimeout(send, timeoutMs);
    };
    sock.on('message', (msg, rinfo) => {
      const [magic, n, seen] = msg.toString('latin1').split(' ');
      if (magic !== MAGIC || n !== nonce || rinfo.address !== target) return;
      finish({ reachable: seen === self, rttMs: performance.now() - started });
    });
    sock.on('error', () => finish({ reachable: false }));
    sock.bind(0, self, send);
  });
}
