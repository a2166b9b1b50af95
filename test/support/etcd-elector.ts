/**
 * A controller replica in a process of its own, for "kill the leader" tests: campaigns with an {@link EtcdLeader},
 * prints `leading` once it leads, then keeps its lease alive until it is killed.
 *
 * Usage: node etcd-elector.ts <endpoints,comma-separated> <prefix> <id> <ttlSeconds>
 */
import { EtcdLeader } from '../../src/adapters/store/store-etcd.ts';

const [endpoints = '', prefix = '', id = '', ttl = ''] = process.argv.slice(2);
const leader = new EtcdLeader({ endpoints: endpoints.split(','), prefix, id, ttlSeconds: Number(ttl) });
await leader.campaign(new AbortController().signal);
process.stdout.write('leading\n');
