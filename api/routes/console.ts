import { z } from 'zod';
import type { RouteTable } from '../http';
import type { ConsoleService } from '../../services/console';

const ConsoleConfig = z
  .object({
    temporalUiUrl: z.string().nullable().describe("The Temporal Web UI's address (TEMPORAL_UI_URL); null when not configured"),
    temporalNamespace: z.string(),
  })
  .openapi('ConsoleConfig');

const Host = z
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

/** GET /api/console/config and GET /api/hosts: what the web console reads besides the resources. */
export function registerConsoleRoutes(t: RouteTable, svc: ConsoleService): void {
  t.add({
    method: 'get',
    path: '/api/console/config',
    tag: 'console',
    summary: "The web console's settings: the Temporal UI's address, for links to a session's workflow",
    responses: { 200: { description: 'Settings', schema: ConsoleConfig } },
    handler: ({ res }) => {
      res.json(svc.config());
    },
  });
  t.add({
    method: 'get',
    path: '/api/hosts',
    tag: 'console',
    summary: "The sandbox hosts: each one's load against its capacity at its last heartbeat, and whether it is lost",
    responses: { 200: { description: 'Hosts', schema: z.object({ hosts: z.array(Host) }) } },
    handler: async ({ res }) => {
      res.json({ hosts: await svc.hosts() });
    },
  });
}
