"""The list_* verbs: what each lists, from which API path, and how each of rabbitmqctl's columns is read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

Reader = Callable[[dict], Any]  # reads one column from one object of the API's answer


def field(*path: str) -> Reader:
    """The value at `path` in the object (None where any step is missing)."""
    def read(item: dict) -> Any:
        for step in path:
            item = item.get(step) if isinstance(item, dict) else None
        return item
    return read


def constant(value: Any) -> Reader:
    return lambda item: value


def definition(item: dict) -> str:
    """A policy's definition as rabbitmqctl shows it: compact JSON with sorted keys."""
    return json.dumps(item.get("definition"), separators=(",", ":"), sort_keys=True)


def tags(item: dict) -> list[str]:
    """A user's or vhost's tags as a list (older APIs send them as one comma-separated string)."""
    value = item.get("tags") or []
    return [tag for tag in value.split(",") if tag] if isinstance(value, str) else value


def same_names(*names: str) -> dict[str, Reader]:
    """Columns whose info key is also the API's field name."""
    return {name: field(name) for name in names}


@dataclass(frozen=True)
class Listing:
    path: str  # the API path; {vhost} is replaced by the quoted vhost
    banner: str  # the line printed before the table; {vhost} is replaced by the vhost, {node} by the node's name
    defaults: tuple[str, ...]  # the columns shown when none are named (rabbitmqctl's)
    columns: dict[str, Reader]  # every column (rabbitmqctl's info key) this listing can show
    summary: str = ""  # the --help line, where "Lists <things> and their properties" does not fit
    only_down: tuple[str, str] | None = None  # the path and banner of --only-down: what is neither running nor starting

    @property
    def per_vhost(self) -> bool:
        return "{vhost}" in self.path


LISTINGS: dict[str, Listing] = {
    "list_queues": Listing(
        "/api/queues/{vhost}", "Listing queues for vhost {vhost} ...", ("name", "messages"),
        same_names("name", "durable", "auto_delete", "exclusive", "arguments", "policy", "operator_policy",
                   "effective_policy_definition", "owner_pid", "exclusive_consumer_tag", "messages_ready",
                   "messages_unacknowledged", "messages", "messages_persistent", "message_bytes",
                   "message_bytes_ready", "message_bytes_unacknowledged", "message_bytes_persistent",
                   "consumers", "consumer_utilisation", "consumer_capacity", "memory", "state", "type", "node",
                   "vhost", "head_message_timestamp")),
    "list_exchanges": Listing(
        "/api/exchanges/{vhost}", "Listing exchanges for vhost {vhost} ...", ("name", "type"),
        same_names("name", "type", "durable", "auto_delete", "internal", "arguments", "policy", "vhost")),
    "list_bindings": Listing(
        "/api/bindings/{vhost}", "Listing bindings for vhost {vhost}...",
        ("source_name", "source_kind", "destination_name", "destination_kind", "routing_key", "arguments"),
        {"source_name": field("source"), "source_kind": constant("exchange"),
         "destination_name": field("destination"), "destination_kind": field("destination_type"),
         "routing_key": field("routing_key"), "arguments": field("arguments"), "vhost": field("vhost")}),
    "list_connections": Listing(
        "/api/connections", "Listing connections ...", ("user", "peer_host", "peer_port", "state"),
        same_names("name", "user", "vhost", "host", "port", "peer_host", "peer_port", "state", "channels",
                   "protocol", "auth_mechanism", "ssl", "timeout", "frame_max", "channel_max", "client_properties",
                   "connected_at", "recv_oct", "recv_cnt", "send_oct", "send_cnt", "send_pend", "node",
                   "user_who_performed_action")),
    "list_channels": Listing(
        "/api/channels", "Listing channels ...", ("pid", "user", "consumer_count", "messages_unacknowledged"),
        {"pid": field("name"), "connection": field("connection_details", "name"),
         **same_names("name", "number", "user", "vhost", "transactional", "confirm", "consumer_count",
                      "messages_unacknowledged", "messages_uncommitted", "acks_uncommitted", "messages_unconfirmed",
                      "prefetch_count", "global_prefetch_count", "state", "node")}),
    "list_consumers": Listing(
        "/api/consumers/{vhost}", "Listing consumers in vhost {vhost} ...",
        ("queue_name", "channel_pid", "consumer_tag", "ack_required", "prefetch_count", "active", "arguments"),
        {"queue_name": field("queue", "name"), "channel_pid": field("channel_details", "name"),
         **same_names("consumer_tag", "ack_required", "prefetch_count", "active", "exclusive", "arguments")}),
    "list_users": Listing(
        "/api/users", "Listing users ...", ("user", "tags"),
        {"user": field("name"), "tags": tags}),
    "list_vhosts": Listing(
        "/api/vhosts", "Listing vhosts ...", ("name",),
        {"tags": tags, **same_names("name", "description", "default_queue_type", "tracing", "messages",
                                    "messages_ready", "messages_unacknowledged")}),
    "list_permissions": Listing(
        "/api/vhosts/{vhost}/permissions", 'Listing permissions for vhost "{vhost}" ...',
        ("user", "configure", "write", "read"),
        same_names("user", "configure", "write", "read")),
    "list_topic_permissions": Listing(
        "/api/vhosts/{vhost}/topic-permissions", 'Listing topic permissions for vhost "{vhost}" ...',
        ("user", "exchange", "write", "read"),
        same_names("user", "exchange", "write", "read")),
    "shovel_status": Listing(
        "/api/shovels", "Shovel status on node {node}",
        ("name", "vhost", "type", "state", "source", "destination", "termination_reason"),
        {"source": field("src_uri"), "destination": field("dest_uri"), "source_protocol": field("src_protocol"),
         "destination_protocol": field("dest_protocol"), "termination_reason": field("reason"),
         "last_changed": field("timestamp"), "source_queue": field("src_queue"),
         "source_exchange": field("src_exchange"), "source_exchange_key": field("src_exchange_key"),
         "destination_queue": field("dest_queue"), "destination_exchange": field("dest_exchange"),
         "destination_exchange_key": field("dest_exchange_key"),
         **same_names("name", "vhost", "type", "state", "node", "forwarded", "pending", "remaining",
                      "remaining_unacked", "blocked_status")},
        "Displays the status of every shovel"),
    "federation_status": Listing(
        "/api/federation-links", "Listing federation links on node {node}...",
        ("id", "uri", "status", "type", "upstream", "exchange", "upstream_exchange", "queue", "upstream_queue",
         "vhost", "local_connection", "last_changed", "error"),
        {"last_changed": field("timestamp"), **same_names(
            "id", "uri", "status", "type", "upstream", "exchange", "upstream_exchange", "queue", "upstream_queue",
            "consumer_tag", "vhost", "local_connection", "error", "node")},
        "Displays the status of every federation link",
        ("/api/federation-links/state/down", "Listing federation links which are down on node {node}...")),
    "list_policies": Listing(
        "/api/policies/{vhost}", 'Listing policies for vhost "{vhost}" ...',
        ("vhost", "name", "pattern", "apply-to", "definition", "priority"),
        {"definition": definition, **same_names("vhost", "name", "pattern", "apply-to", "priority")}),
}


def rows(listing: Listing, columns: list[str], items: list[dict]) -> list[list[Any]]:
    return [[listing.columns[column](item) for column in columns] for item in items]
