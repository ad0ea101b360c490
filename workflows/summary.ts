/**
 * The one-line summaries the Temporal UI shows for each session's and batch's workflow (its user
 * metadata, `staticSummary`): which agent and which id, never the input (a summary is readable in
 * the UI without the payload codec: docs/threat-model.md, "Payloads per organisation"). Pure, so
 * that the batch workflow can use it for its children too.
 */
export function sessionSummary(agentId: string, sessionId: string): string {
  return `agent ${agentId} · session ${sessionId}`;
}

export function batchSummary(agentId: string, batchId: string, total: number, itemIndex?: number): string {
  return itemIndex === undefined
    ? `agent ${agentId} · batch ${batchId} · ${total} items`
    : `agent ${agentId} · batch ${batchId} · item ${itemIndex} of ${total}`;
}
