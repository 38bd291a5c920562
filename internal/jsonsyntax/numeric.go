package jsonsyntax

// Limits of PostgreSQL's numeric, in which jsonb keeps a JSON number
// (checked on PostgreSQL 14 to 18 by the root package's
// TestNumericOverflowAgreesWithTheServer): at most 131 072 digits before
// the decimal point and 16 383 after it once the exponent is applied, and
// an exponent within ±1 073 741 823 (14 refuses a little less for a zero).
const (
	numericMaxDigits   = 131072
	numericMaxScale    = 16383
	numericMaxExponent = 1073741823
)

// NumericOverflow returns the first number in b, JSON text that Valid
// accepts, that PostgreSQL's numeric cannot hold: jsonb refuses such text
// ("value overflows numeric format", 22003), e.g. 1e131072, 1e-16384 or a
// zero with 16 384 zeros after the point. It returns nil when there is
// none. Strings are skipped.
func NumericOverflow(b []byte) []byte {
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c == '"' {
			end := stringEnd(b, i)
			if end < 0 {
				return nil // not JSON: nothing to say
			}
			i = end - 1
			continue
		}
		if c != '-' && !isDigit(c) {
			continue
		}
		if start := i; overflows(b, &i) {
			return b[start:i]
		}
		i-- // the loop's i++ reads the byte after the number
	}
	return nil
}

// overflows reads the number at *i, leaves *i after it and reports
// whether numeric cannot hold it.
func overflows(b []byte, i *int) bool {
	p := *i
	if b[p] == '-' {
		p++
	}
	whole := b[p:digitsEnd(b, p)]
	p += len(whole)
	var frac []byte
	if p < len(b) && b[p] == '.' {
		frac = b[p+1 : digitsEnd(b, p+1)]
		p += 1 + len(frac)
	}
	exp := 0
	if p < len(b) && (b[p] == 'e' || b[p] == 'E') {
		p++
		neg := p < len(b) && b[p] == '-'
		if p < len(b) && (b[p] == '-' || b[p] == '+') {
			p++
		}
		digits := b[p:digitsEnd(b, p)]
		p += len(digits)
		for _, d := range digits {
			if exp = exp*10 + int(d-'0'); exp > numericMaxExponent {
				*i = p
				return true
			}
		}
		if neg {
			exp = -exp
		}
	}
	*i = p
	if len(frac)-exp > numericMaxScale {
		return true
	}
	// The power of ten of the first significant digit (a zero has none),
	// which must stay below numericMaxDigits.
	for j, d := range whole {
		if d != '0' {
			return len(whole)-1-j+exp >= numericMaxDigits
		}
	}
	for j, d := range frac {
		if d != '0' {
			return -1-j+exp >= numericMaxDigits
		}
	}
	return false
}
