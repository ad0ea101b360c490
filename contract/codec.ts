/**
 * The Temporal UI's payload codec endpoint (/codec, /api/codec/link): bodies and views.
 */
import { z } from './zod'; // zod with .openapi()

export const Payloads = z.object({
  payloads: z
    .array(z.object({ metadata: z.record(z.string(), z.string()).optional(), data: z.string().optional() }))
    .max(10_000)
    .describe("Temporal's JSON payloads: metadata values and data in base64"),
});

export const TokenParams = z.object({ token: z.string().min(1).max(2000) });

export const CodecLink = z.object({ endpoint: z.string(), expiresAt: z.string() }).openapi('CodecLink');
