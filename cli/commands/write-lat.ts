// `pagefault-rdma write-lat`: RDMA WRITE latency between two processes or hosts over libfabric (perftest's flags and columns).
import { perftestProgram } from '../fabric-programs.js';

export default perftestProgram('write-lat', 'write', 'lat', 'RDMA WRITE latency');
