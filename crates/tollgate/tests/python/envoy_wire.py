"""Calls Tollgate's Envoy rate-limit service from Python grpcio, with stubs generated from the
same protos as the Rust side (the envoy-types crate's proto directory), to prove wire
compatibility with another gRPC implementation.

Usage: envoy_wire.py PROTO_DIR HOST:PORT OUT_DIR [CA_PEM]. With CA_PEM, over TLS, trusting that
CA for the name localhost. Exits non-zero with a message on a mismatch.
"""

import os
import sys

from google.protobuf import descriptor_pb2
from grpc_tools import protoc
import grpc_tools

proto_dir, address, out = sys.argv[1], sys.argv[2], sys.argv[3]
includes = [os.path.join(proto_dir, d) for d in
            ("data-plane-api", "xds", "googleapis", "protoc-gen-validate", "cel-spec/proto")]
includes.append(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))
flags = ["protoc"] + ["-I" + i for i in includes]

# The service's proto and everything it imports, then stubs for all of them.
descriptor_set = os.path.join(out, "set.pb")
target = "envoy/service/ratelimit/v3/rls.proto"
if protoc.main(flags + ["--descriptor_set_out=" + descriptor_set, "--include_imports", target]) != 0:
    sys.exit("protoc could not read " + target)
files = descriptor_pb2.FileDescriptorSet()
with open(descriptor_set, "rb") as f:
    files.ParseFromString(f.read())
names = [f.name for f in files.file if not f.name.startswith("google/protobuf/")]
if protoc.main(flags + ["--python_out=" + out, "--grpc_python_out=" + out] + names) != 0:
    sys.exit("protoc could not generate the stubs")
sys.path.insert(0, out)

import grpc  # noqa: E402
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # noqa: E402
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # noqa: E402
from google.protobuf import wrappers_pb2  # noqa: E402

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT
HOUR = rls_pb2.RateLimitResponse.RateLimit.HOUR


def check(condition, message):
    if not condition:
        sys.exit("mismatch: " + message)


def descriptor(key, value, hits=None, override=None):
    d = ratelimit_pb2.RateLimitDescriptor(entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)])
    if hits is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits))
    if override is not None:
        d.limit.CopyFrom(ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(
            requests_per_unit=override[0], unit=override[1]))
    return d


if len(sys.argv) > 4:
    with open(sys.argv[4], "rb") as f:
        credentials = grpc.ssl_channel_credentials(root_certificates=f.read())
    channel = grpc.secure_channel(address, credentials, options=[("grpc.ssl_target_name_override", "localhost")])
else:
    channel = grpc.insecure_channel(address)
stub = rls_pb2_grpc.RateLimitServiceStub(channel)


def call(*descriptors, hits=0):
    return stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain="edge", descriptors=list(descriptors),
                                                         hits_addend=hits), timeout=10)


first = call(descriptor("remote_address", "python"))
status = first.statuses[0]
check(first.overall_code == OK, "first call is OK: %s" % first)
check(status.current_limit.requests_per_unit == 2 and status.current_limit.unit == HOUR,
      "current_limit 2 per HOUR: %s" % status)
check(status.limit_remaining == 1, "one left: %s" % status)
check(0 < status.duration_until_reset.seconds <= 3600, "reset within the hour: %s" % status)
headers = {h.key: h.value for h in first.response_headers_to_add}
check(headers.get("RateLimit-Limit") == "2" and headers.get("RateLimit-Remaining") == "1"
      and 0 < int(headers.get("RateLimit-Reset", "0")) <= 3600, "upstream's headers: %s" % first)
meta = first.dynamic_metadata
check(meta["domain"] == "edge" and list(meta["descriptors"][0]["entries"]) == ["remote_address=python"]
      and meta["metadata"]["owner"] == "edge" and meta["metadata"]["nested"]["a"] == 1,
      "dynamic metadata: the request and the descriptor's metadata: %s" % first)

peek = call(descriptor("remote_address", "python", hits=0))
check(peek.statuses[0].limit_remaining == 1, "hits_addend 0 counts nothing: %s" % peek)
check(call(descriptor("remote_address", "python")).overall_code == OK, "second call is OK")
third = call(descriptor("remote_address", "python"))
check(third.overall_code == OVER and third.statuses[0].code == OVER, "third call is over: %s" % third)
check("metadata" not in third.dynamic_metadata.fields, "no metadata when over the limit: %s" % third)

override = call(descriptor("remote_address", "python-override", override=(5, HOUR)), hits=5)
check(override.overall_code == OK and override.statuses[0].limit_remaining == 0,
      "the request's limit and hits_addend apply: %s" % override)
blocked = call(descriptor("remote_address", "python-zero", override=(0, HOUR)))
check(blocked.overall_code == OVER and blocked.statuses[0].limit_remaining == 0,
      "a limit of 0 refuses: %s" % blocked)
elsewhere = stub.ShouldRateLimit(rls_pb2.RateLimitRequest(
    domain="elsewhere", descriptors=[descriptor("k", "v", override=(0, HOUR))]), timeout=10)
check(elsewhere.overall_code == OK and not elsewhere.statuses[0].HasField("current_limit"),
      "a request's limit in an unknown domain is ignored: %s" % elsewhere)
unlimited = call(descriptor("path", "/health"))
check(unlimited.statuses[0].limit_remaining == 2**32 - 1 and not unlimited.statuses[0].HasField("current_limit"),
      "unlimited: %s" % unlimited)
over = call(descriptor("remote_address", "python-hits", hits=3))
check(over.overall_code == OVER and over.statuses[0].limit_remaining == 0, "3 hits against 2: %s" % over)
mixed = call(descriptor("remote_address", "python"), descriptor("path", "/nowhere"))
check([s.code for s in mixed.statuses] == [OVER, OK] and not mixed.statuses[1].HasField("current_limit"),
      "one status per descriptor: %s" % mixed)
try:
    stub.ShouldRateLimit(rls_pb2.RateLimitRequest(domain=""), timeout=10)
    sys.exit("mismatch: an empty domain was accepted")
except grpc.RpcError as e:
    check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, "empty domain: %s" % e.code())
print("ok")
