import { HostError } from '../../contract/errors';

/** The HostError of a host's non-2xx answer: its `{"error":{type,message}}` body, or its status and text. */
export function hostErrorOf(status: number, text: string): HostError {
  let err: { type?: string; message?: string } | undefined;
  try {
    err = (JSON.parse(text) as { error?: typeof err } | undefined)?.error;
  } catch {
    err = undefined;
  }
  return new HostError(err?.type ?? 'internal', status, err?.message ?? `host answered ${status}: ${text.slice(0, 200)}`);
}
