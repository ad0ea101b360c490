import type { ServiceDeps } from '../services/deps';

/** Everything the API needs, built once by api/main.ts (or a test) and passed to createApp: the services' deps. */
export type ApiDeps = ServiceDeps;
