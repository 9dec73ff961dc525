package provider

// maxLabelValue is the longest label value, as in Kubernetes.
const maxLabelValue = 63

// LabelValue maps a provider's string to a label value: 1 to 63
// characters of [A-Za-z0-9._-] that begin and end with an ASCII letter or
// digit. A string already of that form is returned unchanged. Any other
// is mapped deterministically: everything before its first ASCII letter
// or digit is dropped, each run of characters outside [A-Za-z0-9._-]
// (spaces, slashes, non-ASCII, invalid UTF-8) becomes one '-', the result
// is cut to 63 characters, and whatever follows its last letter or digit
// is dropped. ok is false, and v "", when nothing remains (s is empty or
// has no ASCII letter or digit): the label is then left out. Different
// strings may map to the same value, so a label value is never an id.
func LabelValue(s string) (v string, ok bool) {
	if validLabelValue(s) {
		return s, true
	}
	b := make([]byte, 0, min(len(s), maxLabelValue+1))
	pending := false // a run of invalid characters awaits its '-'
	for _, r := range s {
		if len(b) >= maxLabelValue {
			break
		}
		switch {
		case r < 0x80 && isAlnum(byte(r)):
		case r == '-' || r == '_' || r == '.':
			if len(b) == 0 {
				continue // a value begins with a letter or digit
			}
		default:
			pending = len(b) > 0
			continue
		}
		if pending {
			b = append(b, '-')
			pending = false
		}
		b = append(b, byte(r))
	}
	b = b[:min(len(b), maxLabelValue)]
	for len(b) > 0 && !isAlnum(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	if len(b) == 0 {
		return "", false
	}
	return string(b), true
}

func validLabelValue(s string) bool {
	if s == "" || len(s) > maxLabelValue || !isAlnum(s[0]) || !isAlnum(s[len(s)-1]) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}
