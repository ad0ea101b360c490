/**
 * A sandbox host's load, as it reports it (its /healthz answer) and as its registration keeps it.
 */

/** A host's load as /healthz reports it. */
export interface HostCapacity {
  sandboxes: number;
  maxSandboxes: number;
  /** Sum of the live sandboxes' memory limits. */
  reservedMB: number;
  /** The machine's memory. */
  memoryMB: number;
}
