/**
 * A small TCP and UDP prober for kernel tests, run inside a namespace with the project's Node.
 *
 *   l4-probe.ts serve PORT...      listens on TCP and UDP on each port; answers every connection and datagram with
 *                                   "ok", and prints `udp FROM PAYLOAD` for each datagram it gets; exits after 120 s
 *   l4-probe.ts try JSON           JSON is a list of {ip, proto: 'tcp'|'udp', port, from?}; tries them all at once
 *                                   and prints a JSON list of booleans (answered within 800 ms)
 */
import { createServer, connect } from 'node:net';
import { createSocket } from 'node:dgram';

interface Attempt {
  readonly ip: string;
  readonly proto: 'tcp' | 'udp';
  readonly port: number;
  readonly from?: string;
}

const WAIT_MS = 800;

function tryTcp(a: Attempt): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host: a.ip, port: a.port, ...(a.from ? { localAddress: a.from } : {}) });
    const done = (ok: boolean) => {
      clearTimeout(timer);
      s.destroy();
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), WAIT_MS);
    s.on('data', () => done(true));
    s.on('error', () => done(false));
  });
}

function tryUdp(a: Attempt): Promise<boolean> {
  return new Promise((resolve) => {
    const s = createSocket('udp4');
    const done = (ok: boolean) => {
      clearTimeout(timer);
      s.close();
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), WAIT_MS);
    s.on('message', () => done(true));
    s.on('error', () => done(false));
    s.bind({ address: a.from ?? '0.0.0.0', port: 0 }, () => s.send(`probe ${a.port}`, a.port, a.ip));
  });
}

const [mode, ...args] = process.argv.slice(2);
if (mode === 'serve') {
  for (const port of args.map(Number)) {
    createServer((s) => s.end('ok')).listen(port);
    const u = createSocket('udp4');
    u.on('message', (msg, from) => {
      process.stdout.write(`udp ${from.address} ${msg.toString()}\n`);
      u.send('ok', from.port, from.address);
    });
    u.bind(port);
  }
  setTimeout(() => process.exit(0), 120_000);
} else if (mode === 'try') {
  const attempts = JSON.parse(args[0] ?? '[]') as Attempt[];
  const results = await Promise.all(attempts.map((a) => (a.proto === 'tcp' ? tryTcp(a) : tryUdp(a))));
  process.stdout.write(JSON.stringify(results));
  process.exit(0);
} else {
  process.stderr.write('usage: l4-probe.ts serve PORT... | try JSON\n');
  process.exit(2);
}
