package registry

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// AppendJSON appends the node's document to b: the same bytes
// json.Marshal writes for a Node (a test holds the two together), without
// the reflection, for the hot paths (retrieve, lists of thousands of
// nodes). It is deliberately not MarshalJSON: types that embed Node would
// inherit it and lose their own fields.
func (n Node) AppendJSON(b []byte) []byte {
	b = append(b, `{"pk":`...)
	b = strconv.AppendInt(b, n.PK, 10)
	b = append(b, `,"ip":`...)
	b = appendJSONString(b, n.IP)
	b = append(b, `,"index":`...)
	b = strconv.AppendInt(b, int64(n.Index), 10)
	b = append(b, `,"cpu_mem":`...)
	b = strconv.AppendInt(b, n.CPUMem, 10)
	b = append(b, `,"driver_version":`...)
	b = appendJSONString(b, n.DriverVersion)
	b = append(b, `,"hardware_generation":`...)
	b = appendJSONInt(b, n.HardwareGeneration)
	b = append(b, `,"gpu_mem":`...)
	b = appendJSONInt(b, n.GPUMem)
	b = append(b, `,"gpu_model":`...)
	b = appendJSONStringPtr(b, n.GPUModel)
	b = append(b, `,"gpu_uuid":`...)
	b = appendJSONStringPtr(b, n.GPUUUID)
	b = append(b, `,"fabric":`...)
	b = appendJSONStringPtr(b, n.Fabric)
	b = append(b, `,"labels":`...)
	b = n.Labels.AppendJSON(b)
	b = append(b, `,"last_seen":`...)
	b = appendJSONTime(b, n.LastSeen)
	b = append(b, `,"current_job":`...)
	b = appendJSONInt(b, n.CurrentJob)
	b = append(b, `,"lease_expires_at":`...)
	b = appendJSONTime(b, n.LeaseExpiresAt)
	b = append(b, `,"owner":`...)
	b = appendJSONStringPtr(b, n.Owner)
	b = append(b, `,"source":`...)
	b = appendJSONString(b, n.Source)
	b = append(b, `,"schedulable":`...)
	b = strconv.AppendBool(b, n.Schedulable)
	b = append(b, `,"state":`...)
	b = appendJSONString(b, string(n.State))
	b = append(b, `,"cordon_reason":`...)
	b = appendJSONStringPtr(b, n.CordonReason)
	b = append(b, `,"external_id":`...)
	b = appendJSONStringPtr(b, n.ExternalID)
	b = append(b, `,"provider_state":`...)
	b = appendJSONStringPtr(b, n.ProviderState)
	b = append(b, `,"created_at":`...)
	b = appendJSONTime(b, &n.CreatedAt)
	b = append(b, `,"updated_at":`...)
	b = appendJSONTime(b, &n.UpdatedAt)
	b = append(b, `,"version":`...)
	b = strconv.AppendInt(b, n.Version, 10)
	return append(b, '}')
}

func appendJSONInt(b []byte, p *int64) []byte {
	if p == nil {
		return append(b, "null"...)
	}
	return strconv.AppendInt(b, *p, 10)
}

func appendJSONStringPtr(b []byte, p *string) []byte {
	if p == nil {
		return append(b, "null"...)
	}
	return appendJSONString(b, *p)
}

// appendJSONTime writes t as time.Time's MarshalJSON does (RFC 3339 with
// nanoseconds, trailing zeros dropped).
func appendJSONTime(b []byte, t *time.Time) []byte {
	if t == nil {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

const hexDigits = "0123456789abcdef"

// appendJSONString quotes s the way encoding/json does by default: the
// HTML-sensitive <, > and & as \u escapes, U+2028 and U+2029 escaped,
// invalid UTF-8 replaced by U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
