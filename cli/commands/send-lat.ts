// `pagefault-rdma send-lat`: SEND latency between two processes or hosts over libfabric (perftest's flags and columns).
import { perftestProgram } from '../fabric-programs.js';

export default perftestProgram('send-lat', 'send', 'lat', 'SEND latency');
