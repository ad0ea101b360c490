import type { Request } from 'express';
import { invalid } from '../contract/errors';

const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,255}$/;

/** The request's `Idempotency-Key` header (undefined when absent); 400 unless it is 1-255 printable ASCII characters. */
export function idempotencyKeyOf(req: Request): string | undefined {
  const key = req.header('idempotency-key');
  if (key !== undefined && !IDEMPOTENCY_KEY.test(key)) throw invalid('header Idempotency-Key: must be 1-255 printable ASCII characters');
  return key;
}
