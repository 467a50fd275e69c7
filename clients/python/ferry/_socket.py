"""The client's DEALER socket to the broker: CURVE keys, and the handshake monitor whose events
say why a broker does not answer (a refused key, a wrong broker key, CURVE on one side only).

The engine (_engine.py) owns the socket once it is open and reads the monitor's events.
"""

import uuid

import zmq
import zmq.auth

from ._errors import InvalidArgument

HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                    | zmq.EVENT_DISCONNECTED)


def open_dealer(options):
    """A new context, and in it a DEALER connected to options.frontend (with CURVE when
    options.curve_server_public is set) and its monitor's PAIR socket (HANDSHAKE_EVENTS).
    Returns (context, socket, monitor); raises InvalidArgument for unreadable certificates or a
    bad endpoint. Whatever it raises, nothing is left open."""
    ctx = zmq.Context(1)
    sock = monitor = None
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        if options.curve_server_public:
            try:
                server_public, _ = zmq.auth.load_certificate(options.curve_server_public)
                public, secret = zmq.auth.load_certificate(options.curve_secret)
            except (OSError, ValueError) as e:
                raise InvalidArgument("CURVE certificates: %s" % e)
            if secret is None:
                raise InvalidArgument("curve_secret %s holds no secret key (want "
                                      "NAME.key_secret)" % options.curve_secret)
            sock.curve_serverkey = server_public
            sock.curve_publickey = public
            sock.curve_secretkey = secret
        # Handshake events (as the C++ SDK): a refused key or a wrong broker key is said, not
        # left to look like a broker that does not answer.
        monitor = sock.get_monitor_socket(HANDSHAKE_EVENTS,
                                          "inproc://ferry-client-monitor-%s" % uuid.uuid4())
        monitor.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(options.frontend)
        except zmq.ZMQError as e:
            raise InvalidArgument("frontend endpoint %r: %s" % (options.frontend, e))
        return ctx, sock, monitor
    except BaseException:
        for s in (monitor, sock):
            if s is not None:
                s.close(0)
        ctx.term()
        raise


def describe_handshake_failure(event, value, curve):
    """The C++ SDK's protocol::DescribeHandshakeFailure, word for word where it can be."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return ("the broker refused this client's CURVE key (ZAP status %d): its public key is "
                "not in the broker's allowed keys" % value)
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        if value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            return ("the broker does not use CURVE but this client does (security mechanism "
                    "mismatch)" if curve else
                    "the broker requires CURVE: give the broker's public key "
                    "(curve_server_public) and this client's secret key (curve_secret)")
        return "the handshake with the broker failed with a protocol error (ZMTP code %d)" % value
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        return ("the CURVE handshake with the broker failed: the broker's public key "
                "(curve_server_public) is not the key of the broker at that address"
                if curve else "the handshake with the broker failed (a broker with CURVE on "
                "needs curve_server_public and curve_secret)")
    return "handshake event %d (value %d)" % (event, value)
