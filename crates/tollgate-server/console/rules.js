// The algorithms, their parameters, and one sentence each for the rule editor.

export const ALGORITHMS = {
  fixed_window: {
    label: 'Fixed window',
    about: 'Counts requests in consecutive windows of one period: at most limit per window, but up to twice that across a window edge.',
    params: ['limit', 'period', 'align'],
  },
  sliding_window_log: {
    label: 'Sliding window log',
    about: 'Remembers every request: exactly at most limit in any interval of one period (limit up to 10,000).',
    params: ['limit', 'period'],
  },
  sliding_window_counter: {
    label: 'Sliding window counter',
    about: 'Weighs the previous window by how much of it still overlaps: close to a sliding window, in constant memory.',
    params: ['limit', 'period'],
  },
  token_bucket: {
    label: 'Token bucket',
    about: 'Starts full with capacity tokens and adds refill tokens every per: allows bursts up to capacity, then a steady rate.',
    params: ['capacity', 'refill', 'per'],
  },
  gcra: {
    label: 'GCRA (smooth rate)',
    about: 'Spaces requests evenly, one every period / limit, allowing burst at once.',
    params: ['limit', 'period', 'burst'],
  },
  concurrency: {
    label: 'Concurrency',
    about: 'Limits units held at once (through /v1/acquire and /v1/release); a lease not released expires after lease.',
    params: ['limit', 'lease'],
  },
};

export const PARAMS = {
  limit: { label: 'Limit', kind: 'count', help: 'How many requests (units) are allowed.' },
  period: { label: 'Period', kind: 'duration', help: 'A duration like 250ms, 1s, 1m, 1h or 7d.' },
  align: { label: 'Align', kind: 'choice', choices: ['clock', 'first_hit'], help: 'clock: windows start on the clock; first_hit: at a key\'s first request.' },
  capacity: { label: 'Capacity', kind: 'count', help: 'Tokens the bucket holds: the largest burst.' },
  refill: { label: 'Refill', kind: 'count', help: 'Tokens added every per.' },
  per: { label: 'Per', kind: 'duration', help: 'How often refill tokens are added, like 1s.' },
  burst: { label: 'Burst', kind: 'count', help: 'Requests allowed at once before spacing applies.' },
  lease: { label: 'Lease', kind: 'duration', help: 'How long an unreleased lease holds its units, like 30s.' },
};

/** A rule's parameters in words, for lists: "10 per 1s". */
export function describeRule(rule) {
  switch (rule.algorithm) {
    case 'token_bucket':
      return `bucket of ${rule.capacity}, +${rule.refill} per ${rule.per}`;
    case 'gcra':
      return `${rule.limit} per ${rule.period}, burst ${rule.burst}`;
    case 'concurrency':
      return `${rule.limit} at once, lease ${rule.lease}`;
    default:
      return `${rule.limit} per ${rule.period}${rule.align === 'first_hit' ? ' (from first hit)' : ''}`;
  }
}
