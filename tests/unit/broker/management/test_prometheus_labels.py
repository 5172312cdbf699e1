"""Label values in /metrics/per-object, escaped as the Prometheus text format asks (and as prometheus_client's
generate_latest escapes them): a backslash, a new line and a double quote."""

from prometheus_client.parser import text_string_to_metric_families

from broker.management.prometheus import _label_value


def test_a_label_value_escapes_backslash_new_line_and_quote():
    assert _label_value('a\\b\nc"d') == 'a\\\\b\\nc\\"d'


def test_the_escaped_value_parses_back_to_the_original():
    name = 'q "one" \\ two\nthree'
    text = f'rabbitmq_queue_messages_ready{{vhost="/",queue="{_label_value(name)}"}} 3.0\n'
    [family] = text_string_to_metric_families(text)
    assert family.samples[0].labels == {"vhost": "/", "queue": name}
