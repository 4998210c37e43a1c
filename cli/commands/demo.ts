// `pagefault-rdma demo` (npm start): the guided tour.
import { demo } from '../programs/demo.js';
import { runSummary } from '../programs/pingpong.js';
import { defineProgram } from '../program.js';

export default defineProgram({
  name: 'demo',
  summary: 'the guided tour: genuine faults, one faulting RDMA write step by step, ODP vs pinning, ping-pong',
  async run(_options, io) {
    const r = await demo({ trace: io.trace });
    return { results: { ...r, pingPong: r.pingPong.map(runSummary) } };
  },
});
