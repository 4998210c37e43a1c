// `pagefault-rdma read-bw`: RDMA READ bandwidth between two processes or hosts over libfabric (perftest's flags and columns).
import { perftestProgram } from '../fabric-programs.js';

export default perftestProgram('read-bw', 'read', 'bw', 'RDMA READ bandwidth');
