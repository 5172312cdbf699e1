"""One function per verb: each makes its calls to the management API and prints what rabbitmqctl prints."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

from warrenctl import output
from warrenctl.client import Client, NotFound, quote
from warrenctl.errors import EX_DATAERR, EX_NOUSER, EX_SOFTWARE, EX_UNAVAILABLE, EX_USAGE, CommandError
from warrenctl.listings import LISTINGS, rows, tags


@dataclass
class Context:
    """What every verb gets besides its own arguments."""

    client: Client
    quiet: bool  # -q: no informational lines, only results
    as_json: bool  # --formatter json
    headers: bool  # False with --no-table-headers
    out: TextIO = field(default_factory=lambda: sys.stdout)

    def say(self, line: str) -> None:
        """An informational line (rabbitmqctl's "Adding user ..."): not with -q, nor around JSON output."""
        if not self.quiet and not self.as_json:
            self.out.write(line + "\n")


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]  # e.g. ("-u", "--if-unused")
    settings: dict[str, Any]  # argparse's add_argument keywords


@dataclass(frozen=True)
class Verb:
    run: Callable[[Context, Any], None]  # does the work, given the context and the parsed arguments
    summary: str  # one line for --help
    arguments: tuple[str, ...]  # positional arguments; a trailing "..." takes any number
    per_vhost: bool  # takes -p/--vhost
    options: tuple[Option, ...] = ()  # the verb's own options
    details: str = ""  # more help, under the usage


VERBS: dict[str, Verb] = {}


def verb(name: str, summary: str, *arguments: str, per_vhost: bool = False, options: tuple[Option, ...] = ()):
    def register(run: Callable[[Context, Any], None]) -> Callable[[Context, Any], None]:
        VERBS[name] = Verb(run, summary, arguments, per_vhost, options)
        return run
    return register


def user_missing(name: str) -> CommandError:
    return CommandError(f'User "{name}" does not exist', EX_NOUSER)


def vhost_missing(name: str) -> CommandError:
    return CommandError(f"Virtual host '{name}' does not exist", EX_DATAERR)


def exists(client: Client, path: str) -> bool:
    try:
        client.get(path)
    except NotFound:
        return False
    return True


def require_vhost(client: Client, vhost: str) -> None:
    if not exists(client, f"/api/vhosts/{quote(vhost)}"):
        raise vhost_missing(vhost)


def json_argument(text: str, what: str) -> Any:
    """A verb's JSON argument, decoded; EX_DATAERR saying where it does not decode."""
    try:
        return json.loads(text)
    except ValueError as error:
        raise CommandError(f"JSON decoding error in {what}: {error}", EX_DATAERR) from None


def put_in_vhost(client: Client, path: str, body: Any, vhost: str) -> None:
    """PUT an object of a vhost; a vhost that does not exist is said as rabbitmqctl says it."""
    try:
        client.put(path, body)
    except NotFound:
        require_vhost(client, vhost)
        raise


def require_user_and_vhost(client: Client, user: str, vhost: str) -> None:
    """Name which of the two is missing (the API says only "vhost_or_user_not_found" or 404)."""
    if not exists(client, f"/api/users/{quote(user)}"):
        raise user_missing(user)
    require_vhost(client, vhost)


def user_record(client: Client, name: str) -> dict:
    try:
        return client.get(f"/api/users/{quote(name)}")
    except NotFound:
        raise user_missing(name) from None


# --- listings --------------------------------------------------------------------------------------------------

def list_verb(name: str) -> None:
    listing = LISTINGS[name]
    noun = name.removeprefix("list_")

    def run(ctx: Context, args: Any) -> None:
        vhost = getattr(args, "vhost", "/")
        path, banner = listing.only_down if getattr(args, "only_down", False) and listing.only_down else (
            listing.path, listing.banner)
        node = ctx.client.get("/api/overview").get("node", "") if "{node}" in banner and not (
            ctx.quiet or ctx.as_json) else ""
        ctx.say(banner.format(vhost=vhost, node=node))
        try:
            items = ctx.client.get(path.format(vhost=quote(vhost)))
        except NotFound:
            if listing.per_vhost:
                require_vhost(ctx.client, vhost)
            raise
        table = rows(listing, args.columns, items)  # the parser checked the columns
        if ctx.as_json:
            output.json_rows(args.columns, table, ctx.out)
        else:
            output.table(args.columns, table, ctx.headers, ctx.out)

    details = (f"Columns (rabbitmqctl's info keys; default {' '.join(listing.defaults)}): "
               f"{' '.join(listing.columns)}.")
    options = (Option(("--only-down",), {"action": "store_true", "help": "only the links neither running nor "
                                                                         "starting"}),) if listing.only_down else ()
    VERBS[name] = Verb(run, listing.summary or f"Lists {noun} and their properties", ("columns...",),
                       listing.per_vhost, options, details)


for _name in LISTINGS:
    list_verb(_name)


# --- node ------------------------------------------------------------------------------------------------------

@verb("status", "Displays the node's version, alarms, listeners and totals")
def status(ctx: Context, args: Any) -> None:
    overview = ctx.client.get("/api/overview")
    node = overview.get("node", "")
    alarms = node_alarms(ctx.client, node)
    if ctx.as_json:
        ctx.out.write(output.compact({
            "node": node, "product_name": overview.get("product_name"),
            "product_version": overview.get("product_version"), "alarms": alarms,
            "listeners": overview.get("listeners", []), "totals": overview.get("object_totals", {}),
            "queue_totals": overview.get("queue_totals", {})}) + "\n")
        return
    totals = overview.get("object_totals", {})
    lines = [f"Status of node {node} ...", "Runtime", "",
             f"Node name: {node}",
             f"Product name: {overview.get('product_name', '')}",
             f"Product version: {overview.get('product_version', '')}", "",
             "Alarms", "", *(alarms or ["(none)"]), "",
             "Totals", "",
             f"Connection count: {totals.get('connections', 0)}",
             f"Queue count: {totals.get('queues', 0)}",
             f"Virtual host count: {len(ctx.client.get('/api/vhosts'))}", "",
             "Listeners", ""]
    lines += [f"Interface: {listener.get('ip_address')}, port: {listener.get('port')}, "
              f"protocol: {listener.get('protocol')}" for listener in overview.get("listeners", [])]
    ctx.out.write("\n".join(lines) + "\n")


@verb("cluster_status", "Displays every node (with several workers, a node per worker process; in a cluster of "
      "workers, those of every node), which are running, which are in maintenance, and their alarms")
def cluster_status(ctx: Context, args: Any) -> None:
    nodes = ctx.client.get("/api/nodes")
    name = ctx.client.get("/api/cluster-name").get("name", "")
    names = sorted(node.get("name", "") for node in nodes)
    running = sorted(node.get("name", "") for node in nodes if node.get("running"))
    alarms = [(node["name"], resource) for node in sorted(nodes, key=lambda node: node.get("name", ""))
              for resource, field in (("memory", "mem_alarm"), ("disk", "disk_free_alarm")) if node.get(field)]
    maintenance = {node.get("name", ""): "under maintenance" if node.get("being_drained") else "not under maintenance"
                   for node in nodes}
    if ctx.as_json:  # rabbitmqctl cluster_status --formatter json's fields that the API can tell
        ctx.out.write(output.compact({
            "cluster_name": name, "disk_nodes": names, "running_nodes": running, "partitions": {},
            "maintenance_status": {node: maintenance[node] for node in names},
            "alarms": [{"type": "resource_limit", "resource": resource, "node": node} for node, resource in alarms],
            "cpu_cores": {node["name"]: node.get("processors", 0) for node in nodes if node.get("running")}}) + "\n")
        return
    ctx.say(f"Cluster status of node {ctx.client.get('/api/overview').get('node', '')} ...")
    lines = ["Basics", "", f"Cluster name: {name}", "", "Disk Nodes", "", *names, "", "Running Nodes", "", *running,
             "", "Maintenance status", "", *(f"Node: {node}, status: {maintenance[node]}" for node in names),
             "", "Alarms", "",
             *([f"{ALARM_NAMES[resource]} alarm on node {node}" for node, resource in alarms] or ["(none)"]),
             "", "Network Partitions", "", "(none)"]
    ctx.out.write("\n".join(lines) + "\n")


ALARM_NAMES = {"memory": "Memory", "disk": "Free disk space"}  # as rabbitmqctl names a node's resource alarms


@verb("drain", "Puts the node in maintenance, as rabbitmq-upgrade drain: it closes its clients and takes no new ones, "
      "hands every replication group it leads to an in-sync node, and leads none until revived (a node of a cluster)")
def drain(ctx: Context, args: Any) -> None:
    node = ctx.client.get("/api/overview").get("node", "")
    ctx.say(f"Will put node {node} into maintenance mode. The node will no longer serve any client traffic!")
    ctx.client.put(f"/api/nodes/{quote(node)}/maintenance")


@verb("revive", "Takes the node out of maintenance, as rabbitmq-upgrade revive: it takes clients again and may lead")
def revive(ctx: Context, args: Any) -> None:
    node = ctx.client.get("/api/overview").get("node", "")
    ctx.say(f"Will put node {node} back into regular operating mode. The node will again serve client traffic!")
    ctx.client.delete(f"/api/nodes/{quote(node)}/maintenance")


@verb("forget_cluster_node", "Removes a node from the cluster, as rabbitmqctl forget_cluster_node: a node stopped for "
      "good and out of every in-sync replica set, named as cluster_status lists any of its workers", "node")
def forget_cluster_node(ctx: Context, args: Any) -> None:
    ctx.say(f"Removing node {args.node} from the cluster")
    try:
        ctx.client.delete(f"/api/nodes/{quote(args.node)}")
    except NotFound:
        raise CommandError("The node selected is not in the cluster.", EX_DATAERR) from None  # (RabbitMQ's words)


def node_alarms(client: Client, node: str) -> list[str]:
    """The node's resource alarms, as rabbitmqctl status names them."""
    alarms = []
    for entry in client.get("/api/nodes"):
        if entry.get("name") != node:
            continue
        if entry.get("mem_alarm"):
            alarms.append("Memory alarm")
        if entry.get("disk_free_alarm"):
            alarms.append("Free disk space alarm")
    return alarms


# --- users -----------------------------------------------------------------------------------------------------

@verb("add_user", "Creates a new user", "username", "password")
def add_user(ctx: Context, args: Any) -> None:
    ctx.say(f'Adding user "{args.username}" ...')
    path = f"/api/users/{quote(args.username)}"
    if exists(ctx.client, path):
        raise CommandError(f'User "{args.username}" already exists', EX_SOFTWARE)
    ctx.client.put(path, {"password": args.password, "tags": ""})


@verb("delete_user", "Removes a user, closing its connections", "username")
def delete_user(ctx: Context, args: Any) -> None:
    ctx.say(f'Deleting user "{args.username}" ...')
    try:
        ctx.client.delete(f"/api/users/{quote(args.username)}")
    except NotFound:
        raise user_missing(args.username) from None


@verb("change_password", "Changes a user's password", "username", "password")
def change_password(ctx: Context, args: Any) -> None:
    ctx.say(f'Changing password for user "{args.username}" ...')
    record = user_record(ctx.client, args.username)
    ctx.client.put(f"/api/users/{quote(args.username)}",
                   {"password": args.password, "tags": ",".join(tags(record))})


@verb("set_user_tags", "Sets a user's tags (none clears them)", "username", "tags...")
def set_user_tags(ctx: Context, args: Any) -> None:
    ctx.say(f'Setting tags for user "{args.username}" to [{", ".join(args.tags)}] ...')
    record = user_record(ctx.client, args.username)
    ctx.client.put(f"/api/users/{quote(args.username)}",
                   {"password_hash": record.get("password_hash", ""),
                    "hashing_algorithm": record.get("hashing_algorithm", "rabbit_password_hashing_sha256"),
                    "tags": ",".join(args.tags)})


# --- virtual hosts and permissions -----------------------------------------------------------------------------

@verb("add_vhost", "Creates a virtual host", "vhost", options=(
    Option(("--description",), {"help": "a description of the virtual host"}),
    Option(("--tags",), {"help": "comma-separated tags"}),
    Option(("--default-queue-type",), {"help": "the queue type of queues declared without one"})))
def add_vhost(ctx: Context, args: Any) -> None:
    ctx.say(f'Adding vhost "{args.vhost}" ...')
    body = {key: value for key, value in (("description", args.description), ("tags", args.tags),
                                          ("default_queue_type", args.default_queue_type)) if value is not None}
    ctx.client.put(f"/api/vhosts/{quote(args.vhost)}", body)


@verb("delete_vhost", "Deletes a virtual host, its queues and exchanges, closing its connections", "vhost")
def delete_vhost(ctx: Context, args: Any) -> None:
    ctx.say(f'Deleting vhost "{args.vhost}" ...')
    try:
        ctx.client.delete(f"/api/vhosts/{quote(args.vhost)}")
    except NotFound:
        raise vhost_missing(args.vhost) from None


@verb("set_permissions", "Sets a user's configure, write and read permissions in a virtual host",
      "username", "conf", "write", "read", per_vhost=True)
def set_permissions(ctx: Context, args: Any) -> None:
    ctx.say(f'Setting permissions for user "{args.username}" in vhost "{args.vhost}" ...')
    body = {"configure": args.conf, "write": args.write, "read": args.read}
    put_for_user(ctx, "/api/permissions", args.username, args.vhost, body)


def put_for_user(ctx: Context, path: str, user: str, vhost: str, body: dict) -> None:
    """PUT path/{vhost}/{user}; a refusal for want of the user or the vhost says which is missing."""
    try:
        ctx.client.put(f"{path}/{quote(vhost)}/{quote(user)}", body)
    except CommandError as error:
        if error.exit_code == EX_DATAERR and "not_found" in error.message:
            require_user_and_vhost(ctx.client, user, vhost)
        raise


@verb("clear_permissions", "Revokes a user's permissions in a virtual host", "username", per_vhost=True)
def clear_permissions(ctx: Context, args: Any) -> None:
    ctx.say(f'Clearing permissions for user "{args.username}" in vhost "{args.vhost}" ...')
    try:
        ctx.client.delete(f"/api/permissions/{quote(args.vhost)}/{quote(args.username)}")
    except NotFound:
        require_user_and_vhost(ctx.client, args.username, args.vhost)  # else: there was nothing to clear


@verb("set_topic_permissions", "Sets the routing keys a user may publish with (write) and bind with (read) on a "
      "topic exchange of a virtual host", "username", "exchange", "write", "read", per_vhost=True)
def set_topic_permissions(ctx: Context, args: Any) -> None:
    ctx.say(f'Setting topic permissions on "{args.exchange}" for user "{args.username}" in vhost "{args.vhost}" ...')
    body = {"exchange": args.exchange, "write": args.write, "read": args.read}
    put_for_user(ctx, "/api/topic-permissions", args.username, args.vhost, body)


@verb("clear_topic_permissions", "Revokes a user's topic permissions in a virtual host: on one exchange, or on every "
      "one when none is named", "username", "exchange?", per_vhost=True)
def clear_topic_permissions(ctx: Context, args: Any) -> None:
    on = f'on "{args.exchange}" ' if args.exchange is not None else ""
    ctx.say(f'Clearing topic permissions {on}for user "{args.username}" in vhost "{args.vhost}" ...')
    path = f"/api/topic-permissions/{quote(args.vhost)}/{quote(args.username)}"
    try:
        ctx.client.delete(path + (f"?exchange={quote(args.exchange)}" if args.exchange is not None else ""))
    except NotFound:
        require_user_and_vhost(ctx.client, args.username, args.vhost)  # else: there was nothing to clear


@verb("set_vhost_leader", "Has a node of the cluster lead the virtual host from now on (with the other virtual hosts "
      "of its replication group)", "node", per_vhost=True)
def set_vhost_leader(ctx: Context, args: Any) -> None:
    ctx.say(f'Moving the leadership of vhost "{args.vhost}" to node "{args.node}" ...')
    try:
        ctx.client.put(f"/api/vhosts/{quote(args.vhost)}/leader", {"node": args.node})
    except NotFound:
        raise vhost_missing(args.vhost) from None


@verb("move_vhost", "Moves the virtual host's data to another worker's replication group, on a node of several "
      "workers: the two workers stop, and start again once it is moved", "group", per_vhost=True)
def move_vhost(ctx: Context, args: Any) -> None:
    ctx.say(f'Moving vhost "{args.vhost}" to group {args.group} ...')
    group = group_number(args.group)
    try:
        ctx.client.put(f"/api/vhosts/{quote(args.vhost)}/group", {"group": group})
    except NotFound:
        raise vhost_missing(args.vhost) from None


def group_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise CommandError(f"the group is a worker's number, got {text!r}", EX_USAGE) from None


@verb("clear_vhost_leader", "Lets the cluster's elections choose the node that leads the virtual host again",
      per_vhost=True)
def clear_vhost_leader(ctx: Context, args: Any) -> None:
    ctx.say(f'Clearing the leader chosen for vhost "{args.vhost}" ...')
    try:
        ctx.client.delete(f"/api/vhosts/{quote(args.vhost)}/leader")
    except NotFound:
        raise vhost_missing(args.vhost) from None


# --- policies --------------------------------------------------------------------------------------------------

@verb("set_policy", "Sets a policy: the definition (JSON) applies to objects whose name matches the pattern",
      "name", "pattern", "definition", per_vhost=True, options=(
          Option(("--priority",), {"type": int, "default": 0, "help": "the highest priority wins (default 0)"}),
          Option(("--apply-to",), {"choices": ("queues", "exchanges", "all"), "default": "all",
                                   "help": "the kind of object the policy applies to (default all)"})))
def set_policy(ctx: Context, args: Any) -> None:
    ctx.say(f'Setting policy "{args.name}" for pattern "{args.pattern}" to "{args.definition}" '
            f'with priority "{args.priority}" for vhost "{args.vhost}" ...')
    definition = json_argument(args.definition, "the policy definition")
    body = {"pattern": args.pattern, "definition": definition, "priority": args.priority, "apply-to": args.apply_to}
    put_in_vhost(ctx.client, f"/api/policies/{quote(args.vhost)}/{quote(args.name)}", body, args.vhost)


@verb("clear_policy", "Clears a policy", "name", per_vhost=True)
def clear_policy(ctx: Context, args: Any) -> None:
    ctx.say(f'Clearing policy "{args.name}" on vhost "{args.vhost}" ...')
    try:
        ctx.client.delete(f"/api/policies/{quote(args.vhost)}/{quote(args.name)}")
    except NotFound:
        raise CommandError(f'Policy "{args.name}" does not exist in vhost "{args.vhost}"', EX_UNAVAILABLE) from None


# --- runtime parameters, shovels and federation links -----------------------------------------------------------

@verb("set_parameter", "Sets a runtime parameter (a shovel's definition: component shovel) to a JSON value",
      "component", "name", "value", per_vhost=True)
def set_parameter(ctx: Context, args: Any) -> None:
    ctx.say(f'Setting runtime parameter "{args.name}" for component "{args.component}" to "{args.value}" in vhost '
            f'"{args.vhost}" ...')
    value = json_argument(args.value, "the parameter's value")
    put_in_vhost(ctx.client, f"/api/parameters/{quote(args.component)}/{quote(args.vhost)}/{quote(args.name)}",
                 {"value": value}, args.vhost)


@verb("clear_parameter", "Clears a runtime parameter", "component", "name", per_vhost=True)
def clear_parameter(ctx: Context, args: Any) -> None:
    ctx.say(f'Clearing runtime parameter "{args.name}" for component "{args.component}" on vhost "{args.vhost}" ...')
    try:
        ctx.client.delete(f"/api/parameters/{quote(args.component)}/{quote(args.vhost)}/{quote(args.name)}")
    except NotFound:
        raise CommandError(f'Parameter "{args.name}" of component "{args.component}" does not exist in vhost '
                           f'"{args.vhost}"', EX_UNAVAILABLE) from None


@verb("delete_shovel", "Deletes a shovel (stops it and clears its parameter)", "name", per_vhost=True)
def delete_shovel(ctx: Context, args: Any) -> None:
    ctx.say(f"Deleting shovel {args.name} in vhost {args.vhost}")
    require_vhost(ctx.client, args.vhost)
    if not exists(ctx.client, f"/api/parameters/shovel/{quote(args.vhost)}/{quote(args.name)}"):
        raise CommandError(f'Shovel with the given name was not found in virtual host "{args.vhost}"',
                           EX_UNAVAILABLE)
    ctx.client.delete(f"/api/shovels/vhost/{quote(args.vhost)}/{quote(args.name)}")


@verb("restart_shovel", "Starts a shovel again at once (a terminated one too)", "name", per_vhost=True)
def restart_shovel(ctx: Context, args: Any) -> None:
    ctx.say(f"Restarting dynamic Shovel {args.name} in virtual host {args.vhost}")
    try:
        ctx.client.delete(f"/api/shovels/vhost/{quote(args.vhost)}/{quote(args.name)}/restart")
    except NotFound:
        raise CommandError(f"Shovel with the given name was not found in virtual host '{args.vhost}'",
                           EX_UNAVAILABLE) from None


@verb("restart_federation_link", "Starts a federation link again at once", "link_id")
def restart_federation_link(ctx: Context, args: Any) -> None:
    node = ctx.client.get("/api/overview").get("node", "")
    ctx.say(f"Restarting federation link {args.link_id} on node {node}")
    link = next((link for link in ctx.client.get("/api/federation-links") if link.get("id") == args.link_id), None)
    missing = CommandError("Link with the given ID was not found", EX_UNAVAILABLE)
    if link is None:
        raise missing
    try:
        ctx.client.delete(f"/api/federation-links/vhost/{quote(link['vhost'])}/{quote(args.link_id)}/"
                          f"{quote(link['node'])}/restart")
    except NotFound:  # (gone since it was listed)
        raise missing from None


# --- queues and connections ------------------------------------------------------------------------------------

def queue_missing(name: str, vhost: str) -> CommandError:
    return CommandError(f"Queue '{name}' does not exist in vhost '{vhost}'", EX_UNAVAILABLE)


@verb("purge_queue", "Removes every ready message from a queue", "queue", per_vhost=True)
def purge_queue(ctx: Context, args: Any) -> None:
    ctx.say(f"Purging queue '{args.queue}' in vhost '{args.vhost}' ...")
    try:
        ctx.client.delete(f"/api/queues/{quote(args.vhost)}/{quote(args.queue)}/contents")
    except NotFound:
        raise queue_missing(args.queue, args.vhost) from None


@verb("delete_queue", "Deletes a queue", "queue", per_vhost=True, options=(
    Option(("-u", "--if-unused"), {"action": "store_true", "help": "only if the queue has no consumers"}),
    Option(("-e", "--if-empty"), {"action": "store_true", "help": "only if the queue has no ready messages"})))
def delete_queue(ctx: Context, args: Any) -> None:
    ctx.say(f"Deleting queue '{args.queue}' on vhost '{args.vhost}' ...")
    path = f"/api/queues/{quote(args.vhost)}/{quote(args.queue)}"
    conditions = [f"{name}=true" for name, wanted in (("if-unused", args.if_unused), ("if-empty", args.if_empty))
                  if wanted]
    try:
        ready = ctx.client.get(path).get("messages_ready", 0)
        ctx.client.delete(path + ("?" + "&".join(conditions) if conditions else ""))
    except NotFound:
        raise queue_missing(args.queue, args.vhost) from None
    ctx.say(f"Queue was successfully deleted with {ready} ready messages")


@verb("move_queue", "Moves a durable queue to another worker's replication group, on a node of several workers: the "
      "workers that hold it stop, and start again once it is moved", "queue", "group", per_vhost=True)
def move_queue(ctx: Context, args: Any) -> None:
    ctx.say(f"Moving queue '{args.queue}' in vhost '{args.vhost}' to group {args.group} ...")
    group = group_number(args.group)
    try:
        ctx.client.put(f"/api/queues/{quote(args.vhost)}/{quote(args.queue)}/group", {"group": group})
    except NotFound:
        require_vhost(ctx.client, args.vhost)
        raise queue_missing(args.queue, args.vhost) from None


@verb("close_connection", "Closes a connection (named as list_connections name shows it) with a reason",
      "connection", "reason")
def close_connection(ctx: Context, args: Any) -> None:
    ctx.say(f"Closing connection {args.connection}, reason: {args.reason}...")
    try:
        ctx.client.delete(f"/api/connections/{quote(args.connection)}", headers={"X-Reason": args.reason})
    except NotFound:
        raise CommandError(f"Connection '{args.connection}' does not exist", EX_UNAVAILABLE) from None


# --- definitions -----------------------------------------------------------------------------------------------

@verb("export_definitions", "Exports users, vhosts, permissions, policies, queues, exchanges and bindings as JSON "
      "to a file, or to standard output with -", "file")
def export_definitions(ctx: Context, args: Any) -> None:
    definitions = output.compact(ctx.client.get("/api/definitions"))
    if args.file == "-":
        ctx.out.write(definitions + "\n")
        return
    ctx.say(f'Exporting definitions in JSON to a file at "{args.file}" ...')
    try:
        with open(args.file, "w", encoding="utf-8") as target:
            target.write(definitions + "\n")
    except OSError as error:
        raise CommandError(f"cannot write {args.file}: {error.strerror}", EX_DATAERR) from None


@verb("import_definitions", "Imports definitions in JSON from a file, or from standard input with -", "file")
def import_definitions(ctx: Context, args: Any) -> None:
    source = "standard input" if args.file == "-" else f'a file at "{args.file}"'
    ctx.say(f"Importing definitions in JSON from {source} ...")
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CommandError(f"cannot read {args.file}: {getattr(error, 'strerror', None) or error}",
                           EX_DATAERR) from None
    try:
        definitions = json.loads(text)
    except ValueError as error:
        raise CommandError(f"{args.file} is not valid JSON: {error}", EX_DATAERR) from None
    if not isinstance(definitions, dict):
        raise CommandError(f"{args.file} does not hold a JSON object of definitions", EX_DATAERR)
    ctx.client.post("/api/definitions", definitions)
