// `pagefault-rdma rc-pingpong [HOST]`: ibv_rc_pingpong between two processes or hosts over libfabric.
import { rcPingpong } from '../fabric-programs.js';

export default rcPingpong;
