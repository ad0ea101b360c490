/**
 * The one-line summaries the Temporal UI shows for each session's and batch's workflow (its user
 * metadata, `staticSummary`): which agent, which id, and the start of the input. Pure, so that the
 * batch workflow can use it for its children too.
 */
const INPUT_PREVIEW = 80;

function preview(text: string): string {
  const flat = text.replace(/\s+/g, ' ').trim();
  return flat.length > INPUT_PREVIEW ? `${flat.slice(0, INPUT_PREVIEW)}…` : flat;
}

export function sessionSummary(agentId: string, sessionId: string, inputJson?: string): string {
  return `agent ${agentId} · session ${sessionId}${inputJson !== undefined ? ` · input ${preview(inputJson)}` : ''}`;
}

export function batchSummary(agentId: string, batchId: string, total: number, itemIndex?: number): string {
  return itemIndex === undefined
    ? `agent ${agentId} · batch ${batchId} · ${total} items`
    : `agent ${agentId} · batch ${batchId} · item ${itemIndex} of ${total}`;
}
