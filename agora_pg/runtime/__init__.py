"""What the job worker and the pipeline runner share: process helpers, the one
retry helper for database calls, and the lease supervisor."""
