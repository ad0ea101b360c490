import { z } from 'zod';
import type { RouteTable } from '../http';
import type { ConsoleService } from '../../services/ops/console';
import { ConsoleConfig, Host } from '../../contract/console';

/** GET /api/console/config and GET /api/hosts (operators only): what the web console reads besides the resources. */
export function registerConsoleRoutes(t: RouteTable, svc: ConsoleService): void {
  t.add({
    method: 'get',
    path: '/api/console/config',
    tag: 'console',
    summary: "The web console's settings: the key's role, and for operators the Temporal UI's address (links to a session's workflow)",
    responses: { 200: { description: 'Settings', schema: ConsoleConfig } },
    handler: ({ org, res }) => {
      res.json(svc.config(org.role));
    },
  });
  t.add({
    method: 'get',
    path: '/api/hosts',
    tag: 'console',
    operator: true,
    summary: "The sandbox hosts: each one's load against its capacity at its last heartbeat, and whether it is lost",
    responses: { 200: { description: 'Hosts', schema: z.object({ hosts: z.array(Host) }) } },
    handler: async ({ res }) => {
      res.json({ hosts: await svc.hosts() });
    },
  });
}
