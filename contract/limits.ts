/** Limits the public API states in its schemas (the operator's settings are config/limits.ts). */

/** The smallest memory limit accepted anywhere (below it a sandbox cannot start a shell). */
export const MIN_MEMORY_MB = 16;
