/* onnx_wire.c: limits checked on a model's protobuf wire format before
 * protobuf-c unpacks it.
 *
 * onnx__model_proto__unpack recurses once per nested message and has no
 * depth limit: a TypeProto nested a few thousand levels deep (a 34 KB file)
 * overflows the stack.  fe_onnx_check_wire walks the wire format without
 * recursion, with the message descriptors protobuf-c generated from
 * onnx.proto telling a sub-message from a string or bytes field, and an
 * explicit stack of at most FE_ONNX_MAX_DEPTH open messages.
 *
 * Requires: nothing of BYTES (any bytes, any length).  It rejects only what
 * breaks a limit; what is malformed otherwise (a truncated field, a bad
 * varint, a group) is left to the unpack, which reports it.
 */
#include "onnx.h"

/* One open message: its descriptor and where its bytes end. */
typedef struct wire_frame {
  const ProtobufCMessageDescriptor *desc;
  size_t end;
} wire_frame;

/* The varint at *POS (at most 10 bytes, before END) in *V; -1 if malformed. */
static int wire_varint(const uint8_t *b, size_t end, size_t *pos, uint64_t *v) {
  uint64_t r = 0;
  for (int i = 0; i < 10 && *pos < end; i++) {
    uint8_t c = b[(*pos)++];
    r |= (uint64_t)(c & 0x7f) << (7 * i);
    if (!(c & 0x80)) {
      *v = r;
      return 0;
    }
  }
  return -1;
}

/* Skips the value of wire type WT at *POS; -1 if malformed or a group
 * (protobuf-c does not take groups), with *LEN the length of a
 * length-delimited value (its bytes not skipped). */
static int wire_value(const uint8_t *b, size_t end, size_t *pos, int wt, uint64_t *len) {
  uint64_t v;
  *len = 0;
  switch (wt) {
  case 0: return wire_varint(b, end, pos, &v);
  case 1: return end - *pos < 8 ? -1 : (*pos += 8, 0);
  case 5: return end - *pos < 4 ? -1 : (*pos += 4, 0);
  case 2:
    if (wire_varint(b, end, pos, len) || *len > end - *pos) return -1;
    return 0;
  default: return -1;
  }
}

int fe_onnx_check_wire(const uint8_t *bytes, size_t len, char *why, size_t whylen) {
  if (len > FE_ONNX_MAX_BYTES) {
    snprintf(why, whylen, "the model is %zu bytes, larger than a protobuf message may be (%zu bytes)", len,
             (size_t)FE_ONNX_MAX_BYTES);
    return -1;
  }
  wire_frame st[FE_ONNX_MAX_DEPTH];
  int depth = 1;
  size_t pos = 0;
  st[0] = (wire_frame){&onnx__model_proto__descriptor, len};
  while (depth > 0) {
    wire_frame *top = &st[depth - 1];
    if (pos >= top->end) { /* a message ends where its length says */
      depth--;
      continue;
    }
    uint64_t tag, flen;
    if (wire_varint(bytes, top->end, &pos, &tag) || wire_value(bytes, top->end, &pos, (int)(tag & 7), &flen))
      return 0; /* malformed: the unpack says so */
    if ((tag & 7) != 2) continue;
    const ProtobufCFieldDescriptor *f =
        tag >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(top->desc, (unsigned)(tag >> 3)) : NULL;
    if (!f || f->type != PROTOBUF_C_TYPE_MESSAGE) {
      pos += flen; /* a string, bytes, a packed array or an unknown field */
      continue;
    }
    if (depth == FE_ONNX_MAX_DEPTH) {
      snprintf(why, whylen, "the protobuf nests messages more than %d deep (a %s inside a %s at byte %zu)",
               FE_ONNX_MAX_DEPTH, ((const ProtobufCMessageDescriptor *)f->descriptor)->short_name,
               top->desc->short_name, pos);
      return -1;
    }
    st[depth++] = (wire_frame){f->descriptor, pos + flen};
  }
  return 0;
}
