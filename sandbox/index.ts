/** The sandbox runtime's public surface: the host contract's types and the client that speaks it. */
export * from './types';
export { HostClient, HostError, decodeExecFrame, encodeStdinFrame, type ExecFrame, type HostClientOptions } from './host/client';
export { SandboxError, errorStatus, isSandboxError, type SandboxErrorType } from './errors';
export { createSandboxProvider, type SandboxProvider, type ProviderKind, type SpawnOptions } from './provider';
