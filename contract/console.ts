/** What the web console reads besides the resources: its settings and the sandbox hosts' load. */
import { z } from './zod'; // zod with .openapi()

export const ConsoleConfig = z
  .object({
    temporalUiUrl: z
      .string()
      .nullable()
      .describe("The Temporal Web UI's address (TEMPORAL_UI_URL), an operator's tool: null for a tenant's key, and when not configured"),
    temporalNamespace: z.string(),
    role: z.enum(['tenant', 'operator']).describe("The caller's key's role: operators also see the hosts and the Temporal UI"),
  })
  .openapi('ConsoleConfig');

/** One sandbox host as the console shows it: its load against its capacity, and whether it is lost. No address, no token. */
export const Host = z
  .object({
    hostId: z.string(),
    status: z.enum(['live', 'lost']).describe('lost: marked lost, or no heartbeat within HOST_DEAD_AFTER'),
    heartbeatAt: z.string(),
    lostAt: z.string().nullable(),
    sandboxes: z.number().int().nullable().describe('Live sandboxes at the last heartbeat'),
    maxSandboxes: z.number().int().nullable().describe('HOST_MAX_SANDBOXES of that host'),
    reservedMB: z.number().nullable().describe("Sum of its live sandboxes' memory limits"),
    memoryMB: z.number().nullable().describe("The machine's memory"),
  })
  .openapi('Host');
