/** The sandbox of a session: derived from the session id so a retried provision finds it again. */
export function sandboxIdForSession(sessionId: string): string {
  return `sb-${sessionId.replace(/^sess_/, 's')}`;
}
