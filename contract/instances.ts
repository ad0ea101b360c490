/**
 * Agent instances (/v1/agents/{agentId}/instances): ids and views.
 */
import { z } from './zod'; // zod with .openapi()
import { AgentParams } from './schemas';

export const InstanceId = z.string().regex(/^inst_[a-z0-9]{1,64}$/, 'must be an instance id (inst_…)');

export const InstanceParams = AgentParams.extend({ id: InstanceId });

export const StatusEnum = z.enum(['creating', 'running', 'failed', 'stopped']);

export const InstanceView = z
  .object({
    id: z.string(),
    agent_id: z.string(),
    status: StatusEnum,
    metadata: z.record(z.string(), z.unknown()),
    sandbox_id: z.string().nullable(),
    snapshot_id: z.string().nullable(),
    error: z.string().nullable(),
    created_at: z.string(),
    updated_at: z.string(),
  })
  .openapi('Instance');
