"""Durable storage for messages and definitions.

Public API (``storage.store``)::

    store = MessageStore(data_dir, loop=None, on_health=None)  # on_health(healthy: bool), also store.on_health
    recovered = store.recover()                 # once, before serving; locks data_dir/.lock first (DataDirLocked)
    place = store.append_message(msg_id, queues, exchange, routing_key, header_payload, body)  # where its record is
    store.pin(queue, place, count); store.unpin(queue, place, count)  # a paging queue will read the record back from there
    run = store.run_of(queue, ids, places, ...)  # such records, once durable, as a run (storage.recovered_messages.StoredRun)
    store.append_removed(queue, msg_ids)        # acked / rejected / expired / purged from that queue
    store.append_delivered(queue, msg_ids)      # never waits; the message comes back redelivered
    store.append_definition(kind, name, data)   # kind: exchange/queue/binding/vhost/user/policy; data None = deleted
    store.definitions()                         # every live one as (kind, name, data), in creation order
    store.delete_queue(queue)                   # its messages and its "queue" definition are gone
    store.when_durable(callback)                # callback(ok) on the loop once all the above is fsynced
    log = store.streams.open(key, max_segment_bytes, max_bytes, max_age_ms, fresh)  # a stream queue's own log
    log.append(exchange, routing_key, header_payload, body)  # written with the next batch; log.on_readable() after
    log.read(offset, limit, wait); log.first_offset; log.next_offset  # durable messages by offset (storage.streams;
                                                # wait: a chunk not in memory is read on a thread, on_readable() then)
    store.streams.delete(key); store.streams.remove_orphans()   # a deleted stream; at start, what deleted ones left
    copies = store.copy_messages([(recovered_messages, new_key), ...], first_id)  # at start: fsynced before it returns
    store.streams.rename(key, new_key); store.set_aside(key, recovered_messages)  # at start: to quarantine/, durably
    store.healthy                               # False while writes fail (then every callback gets False)
    store.close()                               # flush, fsync, stop the writer (at most stop_timeout=60 s), unlock
    store.stats()                               # bytes_on_disk, segments, live_messages, index_bytes, fsyncs ...

``Recovered`` holds exchanges/queues/bindings (plus vhosts/users/policies): the ``data`` dicts last given to
``append_definition``, in creation order; ``messages``: queue -> ``RecoveredMessages`` in queue (= msg id) order,
kept as columns (id, place of the record, body size) and read back as ``StoredMessage`` objects, all of them
(iteration), a slice (``read(start, stop)``) or in runs a deep queue pages in one at a time (``runs()``:
``StoredRun.fetch()`` reads the bytes on any thread, ``messages(data, make)`` decodes them, ``release()`` once read
or dropped); until then their segments are pinned for the queue (not compacted; ``delete_queue`` unpins them)
(``storage.recovered_messages``);
``next_msg_id``; ``set_aside_definitions``: (kind, name) of definitions whose record could not be decoded (keep
such a queue's messages); ``report`` (records, bytes, segments, torn_tail_bytes, corrupt_segments, corrupt_ranges,
quarantined_bytes, set_aside_records, rehomed_messages, definitions_damaged (definitions may be missing that
nobody can name: keep every queue's messages), messages, clean_shutdown, seconds). ``recover()`` raises
``storage.format.UnsupportedFormat`` (its text says why) for a data dir written by a newer store format.

Contract with the broker:
- Every method runs on the event loop thread. ``append_*`` make no syscall: they add framed records to the pending
  batch. One writer thread writes each batch and calls fdatasync once per file touched, and fsync once per directory
  whose entries changed (a new segment, log, stream directory, a rewrite renamed over; kept for the next batch if
  that one failed), then hands the batch's callbacks back with one ``call_soon_threadsafe``. A lone append is handed
  over on the next loop turn; appends made while a batch is being written form the next batch (group commit, no
  timer). Directories made at start (the data dir at its first use, ``messages/``) are fsynced before serving.
- ``msg_id`` must increase from one ``append_message`` to the next (ValueError otherwise); ids are what the index
  is built on. Recovery never fails on ids that do not increase on disk: such publishes get fresh ids. Use the same
  queue key (the broker's ``broker.model.keys.queue_key``) in ``append_message``/``append_removed`` as the name of
  the queue's definition, since ``delete_queue`` drops both.
- callback(False) means the batch could not be written (disk full, EIO): nack those publishes. The store has
  already forgotten the messages of that batch, and later batches are tried again normally. If even undoing the
  partial write fails, every later batch fails too (``stats()["failed"]``); what was confirmed before is kept.
- Health: a batch that cannot be written makes the store unhealthy: ``on_health(False)`` runs on the loop before
  that batch's callbacks (False); the next batch that writes bytes makes it healthy again (``on_health(True)``).
  While unhealthy every batch is still tried, so callbacks get False promptly, and a record that changes nothing is
  written once a second, so health comes back without other traffic. After a failed batch the store moves on to a
  fresh segment, so the segment that filled the disk can be deleted once its messages are consumed. A bug in the
  writer (any exception) fails only its batch or its compaction and is logged CRITICAL; if the writer thread dies,
  every later batch fails at once. ``close()`` waits at most ``stop_timeout`` for the writer and logs CRITICAL if it
  did not stop (the lock is then kept until the process exits).
- One store per data dir: ``recover()`` takes an exclusive ``flock`` on ``data_dir/.lock`` (which holds the owner's
  pid) and raises ``storage.lock.DataDirLocked`` ('data dir X is in use by another Warren (pid N)') while another
  process holds it. ``close()`` or the end of the process releases it; a recovery that raises releases it too.
- Redelivered flag: tracked through ``append_delivered``. A recovered message is redelivered=True iff a delivery
  of it from that queue reached the disk, after a clean close or a crash alike. DELIVERED records ride with the
  next batch without being waited for, so a delivery made just before a crash may come back redelivered=False.
  The removals (and deliveries) of one queue gathered in a batch are written as one record.
- After ``close()`` a restart shows exactly the state before. After kill -9, every message whose callback ran is
  back; a removal whose callback had not run yet may or may not be undone (at-least-once).

Replication (``storage.replica``; nothing of it runs unless ``replicate`` is called): ``store.replicate(tap, gate)``,
once start-up is done, has the writer thread hand ``tap(sequence, ops)`` every change it makes to the data dir, as
frames numbered 1, 2, ...: a batch's appends (and stream resets, definitions rewrite) before its own fdatasync, then
its unlinks, each finished compaction (REPLACE with the rewritten segment), and the TRUNCATEs that undo a failed
batch. Each batch's callbacks (failed ones too) then run only inside ``release()`` of ``gate(sequence, release)``,
called on the loop in order, ``sequence`` being the last frame covering the batch; stream logs and health are told
at once. ``store.request_cut(callback)`` has the writer, between two batches, call ``callback(sequence, [(path, fd,
size), ...])`` with every replicated file (``replica.replicated_files``) held open for reading and its size: those
bytes, then the frames after ``sequence``, rebuild the data dir even if files are renamed over or unlinked meanwhile;
the callback owns the fds. On a follower ``replica.ReplicaWriter.apply(frames)`` applies a group of frames (one
fdatasync per file per group, on the caller's thread) and returns the highest sequence durable; its data dir stays
byte-identical to the leader's (all but ``.lock``, ``clean-shutdown``, ``cluster-state``, ``pages/`` and
``quarantine/``), so promotion is ``recover()``.
``store.writer_progress()`` is ``time.monotonic()`` of the last batch or compaction slice the writer finished, to tell
a stuck disk.

Layout on disk (``data_dir``): ``messages/NNNNNNNNNN.seg`` segments of about 16 MiB, ``definitions.log``,
``streams/<hash of the key>/<first offset>.seg`` (stream logs, written and fsynced with each batch), ``.lock``
(the owner's pid; never deleted),
``format`` (the store format version, ``storage.format``), ``clean-shutdown`` between a graceful close and the next
start, and ``quarantine/<file>@<offset>``: damaged or unusable bytes recovery took out of a file (kept for
forensics; safe to delete), with ``messages-<hash of the key>`` and ``stream-<hash of the key>``: what ``set_aside``
kept. Records are ``[length u32][crc32 u32][payload]``. Recovery reads past a damaged record
to the next intact one and never drops intact records: damage that ends a file still being written is a torn tail
(cut, WARNING), any other is corruption (ERROR with file, offset, size and what was lost); either way the file is
repaired so the next start does not meet it again (``storage.recovery``, ``storage.salvage``).
Segments whose messages are all gone are deleted (even while being rewritten); closed segments with half their
messages gone are rewritten in place by the writer thread once they stop losing messages for a batch, a slice at a
time between batches and at least twice as fast as batches are written, so disk use stays near what is queued plus
a few segments however fast publishers go. The index costs about one byte per queued message.
"""
