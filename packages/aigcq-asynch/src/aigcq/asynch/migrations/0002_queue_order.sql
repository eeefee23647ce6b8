-- Retries may jump the queue (priority 1 = head), and an attempt number fences a worker whose
-- task was timed out and requeued meanwhile. Indexes for the queue, the cleaner and autoTune.

ALTER TABLE asynch_task ADD COLUMN IF NOT EXISTS priority SMALLINT NOT NULL DEFAULT 0;
ALTER TABLE asynch_task ADD COLUMN IF NOT EXISTS attempt INTEGER NOT NULL DEFAULT 0;

CREATE INDEX IF NOT EXISTS asynch_task_queue_idx ON asynch_task (priority DESC, enqueue_at, id) WHERE state = 0;
CREATE INDEX IF NOT EXISTS asynch_task_state_idx ON asynch_task (state, model_name);
CREATE INDEX IF NOT EXISTS asynch_task_finished_idx ON asynch_task (model_name, finished_at)
    WHERE started_at IS NOT NULL;
