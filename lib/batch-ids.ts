/**
 * The session id of attempt `attempt` (1-based) of item `index` of a batch: derived, so a
 * restarted worker, server or batch finds the same session instead of running the item again.
 * It matches `^sess_[a-z0-9]{1,64}$`. Pure: the batch workflow imports it too.
 */
export function batchSessionId(batchId: string, index: number, attempt: number): string {
  return `sess_${batchId.replace(/^batch_/, '')}x${index}a${attempt}`;
}
