/** Limits the public API states in its schemas (the operator's settings are config/limits.ts). */

/** The smallest memory limit accepted anywhere (below it a sandbox cannot start a shell). */
export const MIN_MEMORY_MB = 16;

/** Checkpoints a sandbox may have at once (OpenComputer's limit): the next create is 400 until one is deleted. */
export const MAX_CHECKPOINTS_PER_SANDBOX = 10;
