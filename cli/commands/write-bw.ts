// `pagefault-rdma write-bw`: RDMA WRITE bandwidth between two processes or hosts over libfabric (perftest's flags and columns).
import { perftestProgram } from '../fabric-programs.js';

export default perftestProgram('write-bw', 'write', 'bw', 'RDMA WRITE bandwidth');
