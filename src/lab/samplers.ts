/**
 * The faults' samplers, held across a fault (src/lab/faults.ts): a continuous ping from one pod to another, replies
 * timestamped as they arrive ({@link Pinger}), and a TCP connection held open with a 100 ms beat ({@link Flow}). Their
 * processes run in the pods' namespaces, are bounded in time whatever happens to the lab, and are stopped by PID.
 */
import type { LabPodPair } from './plan/faults.ts';
import type { PingReply } from './plan/fault-samples.ts';
import type { FlowResult } from './plan/fault-results.ts';
import { Child } from './io/child-process.ts';
import { PROJECT_NODE } from './agent-process.ts';
import type { LabPodInfo } from './lab-pods.ts';

/** The interval of the samples' pings, in seconds (`ping -i`). */
export const PING_INTERVAL_S = '0.1';

/**
 * A continuous ping from one pod to another, replies timestamped as they arrive. When the source pod is re-created
 * in a new namespace (CRI: a new sandbox), {@link Pinger.moveTo} continues the sample from there, numbering on.
 */
export class Pinger {
  readonly pair: LabPodPair;
  readonly replies: PingReply[] = [];
  readonly #to: LabPodInfo;
  #proc: Child;
  #out = '';
  /** Packets the earlier ping processes of this sample transmitted. */
  #seqBase = 0;

  constructor(pair: LabPodPair, from: LabPodInfo, to: LabPodInfo) {
    this.pair = pair;
    this.#to = to;
    this.#proc = this.#spawn(from);
  }

  #spawn(from: LabPodInfo): Child {
    // -c bounds its life (300 s of pings) even if the lab forgets it; the lab stops it with SIGINT (ping then prints
    // its statistics). Not -w: with a deadline ping exits at the first ICMP error (a host unreachable while the
    // destination pod is away), and the sample would never answer again
    const argv = [...from.enter, 'ping', '-n', '-i', PING_INTERVAL_S, '-W', '1', '-c', String(300 / Number(PING_INTERVAL_S)), this.#to.ip];
    const proc = new Child(argv, { output: 'pipe' });
    this.#out = '';
    const base = this.#seqBase;
    let partial = '';
    proc.stdout?.on('data', (d: Buffer) => {
      const text = partial + d.toString();
      const lines = text.split('\n');
      partial = lines.pop() ?? '';
      const at = performance.now();
      for (const line of lines) {
        this.#out += `${line}\n`;
        const m = /bytes from .*icmp_seq=(\d+).*time=([\d.]+)/.exec(line);
        if (m) this.replies.push({ seq: base + Number(m[1]), atMs: at, rttMs: Number(m[2]) });
      }
    });
    proc.stderr?.on('data', () => {});
    return proc;
  }

  /** Answering now: the last three packets sent got replies, the last one after `sinceMs`. */
  healthy(sinceMs: number): boolean {
    const last = this.replies.at(-1);
    if (!last || last.atMs < sinceMs) return false;
    const seqs = new Set(this.replies.map((r) => r.seq));
    return seqs.has(last.seq) && seqs.has(last.seq - 1) && seqs.has(last.seq - 2);
  }

  /** Continues the sample from `from` (the source pod re-created): stops this ping, starts one there. */
  async moveTo(from: LabPodInfo): Promise<void> {
    this.#seqBase += await this.#stopProcess();
    this.#proc = this.#spawn(from);
  }

  /** Stops the ping by PID and returns what the sample transmitted in all. */
  async stop(): Promise<number> {
    return this.#seqBase + await this.#stopProcess();
  }

  async #stopProcess(): Promise<number> {
    const proc = this.#proc;
    if (proc.running) {
      proc.kill('SIGINT');
      const timer = setTimeout(() => proc.kill('SIGKILL'), 2000);
      await proc.closed();
      clearTimeout(timer);
    }
    return Number(/(\d+) packets transmitted/.exec(this.#out)?.[1] ?? 0);
  }
}

/** Port of the flows' echo server in the destination pod (the probe's port is 7777). */
const FLOW_PORT = 7778;
/** Bound on waiting for the flows to connect and echo before the fault. */
export const FLOW_START_TIMEOUT_MS = 15_000;
/** Bound on a flow's processes, whatever happens to the lab. */
const FLOW_MAX_S = 300;

/**
 * A TCP connection from one pod to another held open through a fault: an echo server in the destination pod, a
 * client in the source pod writing a line every 100 ms and timing the echoes. Both are bounded in time and stopped
 * by PID.
 */
export class Flow {
  readonly pair: LabPodPair;
  readonly #from: LabPodInfo;
  readonly #to: LabPodInfo;
  readonly #server: Child;
  #client: Child | undefined;
  /** The client's last report. */
  #last = '';

  constructor(pair: LabPodPair, from: LabPodInfo, to: LabPodInfo) {
    this.pair = pair;
    const server = [...to.enter, PROJECT_NODE, '-e',
      `require('net').createServer((s)=>{s.on('error',()=>{});s.pipe(s)}).listen(${FLOW_PORT});setTimeout(()=>process.exit(0),${FLOW_MAX_S * 1000})`];
    this.#server = new Child(server, { output: 'ignore' });
    this.#from = from;
    this.#to = to;
  }

  /**
   * Connects (retrying while the server is not listening yet, at most 10 s) and starts the 100 ms beat; the client
   * reports `sent echoed longest-gap error` every beat.
   */
  start(): void {
    const script = [
      `const net=require('net');let s,sent=0,echoed=0,last=0,gap=0,err='',tries=0;`,
      `const go=()=>{s=net.connect(${FLOW_PORT},'${this.#to.ip}');s.setNoDelay(true);`,
      `s.on('connect',()=>{last=Date.now();setInterval(()=>{s.write('atoll-lab-flow-beat\\n');sent+=20},100)});`,
      `s.on('data',(d)=>{const n=Date.now();gap=Math.max(gap,n-last);last=n;echoed+=d.length});`,
      `s.on('error',(e)=>{if(!last&&e.code==='ECONNREFUSED'&&tries++<100){setTimeout(go,100);return}err=e.code||e.message});`,
      `s.on('close',()=>{if(last)err=err||'closed-by-peer'})};go();`,
      `setInterval(()=>process.stdout.write(sent+' '+echoed+' '+Math.max(gap,last?Date.now()-last:0)+' '+err+'\\n'),100);`,
      `setTimeout(()=>process.exit(3),${FLOW_MAX_S * 1000})`,
    ].join('');
    const client = [...this.#from.enter, PROJECT_NODE, '-e', script];
    this.#client = new Child(client, { output: 'stdout' });
    let partial = '';
    this.#client.stdout?.on('data', (d: Buffer) => {
      const lines = (partial + d.toString()).split('\n');
      partial = lines.pop() ?? '';
      this.#last = lines.at(-1) ?? this.#last;
    });
  }

  /** The connection is up and the first echo came back. */
  flowing(): boolean {
    const st = this.#state();
    return st.err === '' && st.echoed > 0;
  }

  #state(): { sent: number; echoed: number; gap: number; err: string } {
    const [sent, echoed, gap, err] = this.#last.split(' ');
    return { sent: Number(sent ?? 0), echoed: Number(echoed ?? 0), gap: Number(gap ?? 0), err: err ?? '' };
  }

  /** Every line sent so far came back (give or take the beat in flight), and the connection is open. */
  caughtUp(): boolean {
    const st = this.#state();
    return st.err === '' && st.sent > 0 && st.echoed >= st.sent - 40;
  }

  /** Stops both ends by PID and says whether the connection lived through and caught up. */
  async stop(): Promise<FlowResult> {
    const st = this.#last ? this.#state() : { sent: 0, echoed: 0, gap: 0, err: 'the flow client said nothing' };
    const caughtUp = this.caughtUp();
    await Promise.all([this.#client?.stop('SIGKILL'), this.#server.stop('SIGKILL')]);
    const error = st.err || (caughtUp ? undefined : `${st.sent - st.echoed} bytes never echoed`);
    return { ...this.pair, survived: error === undefined, sentBytes: st.sent, echoedBytes: st.echoed, maxGapMs: st.gap, ...(error ? { error } : {}) };
  }
}
