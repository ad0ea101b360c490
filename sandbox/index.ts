/**
 * The one module the control plane (api/, activities/, worker/, store/, scripts/) imports from
 * sandbox/: the host contract only — the HTTP client of a sandbox host, the wire types, the exec
 * frame bytes and codec, the egress policy's checks — and the few host-side names that read a host's files.
 * It pulls no runtime (drivers, nftables, C helpers) into the importing process; a process that runs
 * a host imports ./host/main (or ./host/server) itself.
 */
export * from './host-contract/types';
export { HostClient, HostError, decodeExecFrame, encodeStdinFrame, type ExecFrame, type HostClientOptions } from './host-contract/client';
export type { HostCapacity } from '../contract/hosts';
export { writeRawFrame } from './host-contract/frames';
export { FRAME_EXIT, FRAME_SCROLLBACK_END, FRAME_STDERR, FRAME_STDIN, FRAME_STDOUT } from './host-contract/exec-frames';
export { normaliseEgress, normaliseAllowEntry, type Egress } from '../contract/network';
export { countRuns, defaultAuditLogPath } from './audit-log';
export { defaultScratchDir } from './scratch';
