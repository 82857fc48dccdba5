package reference

import "math"

// brMaxFeatures is the most features a bayesRidge model takes: the
// latency predictor's TTFT model has eight (see llmd_latency.go).
const brMaxFeatures = 8

// brVec is one row of features.
type brVec = [brMaxFeatures]float64

// bayesRidge is a Bayesian ridge regression over standardized features,
// as the latency predictor of GIE's latencypredictor/training_server.py
// (1748e829) fits it with scikit-learn: StandardScaler (mean and
// population standard deviation; a constant feature keeps scale 1), then
// BayesianRidge with its defaults (at most 300 evidence iterations,
// tolerance 1e-3 on the summed change of the coefficients, gamma priors
// alpha_1 = alpha_2 = lambda_1 = lambda_2 = 1e-6, an intercept). Its zero
// value predicts 0 for every row. Not safe for concurrent use.
type bayesRidge struct {
	p                 int
	mean, scale, coef brVec
	intercept         float64
	alpha, lambda     float64 // the fitted noise and weight precisions
}

// Bayesian ridge defaults (sklearn.linear_model.BayesianRidge).
const (
	brMaxIter = 300
	brTol     = 1e-3
	brPrior   = 1e-6 // alpha_1, alpha_2, lambda_1, lambda_2
)

// constantModel returns a model that predicts y for every row: what the
// predictor's default model, fit to one sample, predicts.
func constantModel(y float64) bayesRidge { return bayesRidge{intercept: y} }

// predict returns the model's estimate for row x (its first p features).
func (m *bayesRidge) predict(x *brVec) float64 {
	y := m.intercept
	for j := 0; j < m.p; j++ {
		y += m.coef[j] * (x[j] - m.mean[j]) / m.scale[j]
	}
	return y
}

// fitBayesRidge fits a model of p features (at most brMaxFeatures) to the
// rows each yields; each is called twice (one pass for the means, one for
// the centred sums) and must yield the same rows. It reports false, and
// the zero model, when there is no row or the fit is not finite.
func fitBayesRidge(p int, each func(yield func(x *brVec, y float64))) (bayesRidge, bool) {
	m := bayesRidge{p: p}
	var n float64
	var ymean float64
	each(func(x *brVec, y float64) {
		n++
		for j := 0; j < p; j++ {
			m.mean[j] += (x[j] - m.mean[j]) / n
		}
		ymean += (y - ymean) / n
	})
	if n == 0 {
		return bayesRidge{}, false
	}
	// Centred scatter of the features, their cross products with the
	// target, and the target's own.
	var s [brMaxFeatures]brVec
	var sxy brVec
	var syy float64
	each(func(x *brVec, y float64) {
		dy := y - ymean
		syy += dy * dy
		for j := 0; j < p; j++ {
			dj := x[j] - m.mean[j]
			sxy[j] += dj * dy
			for k := 0; k <= j; k++ {
				s[j][k] += dj * (x[k] - m.mean[k])
			}
		}
	})
	// Standardize: StandardScaler's population deviation; a constant
	// feature (no spread beyond rounding) keeps scale 1 and, centred, is 0.
	for j := 0; j < p; j++ {
		v := s[j][j] / n
		if v <= 1e-24*(m.mean[j]*m.mean[j]+1) {
			m.scale[j] = 1
			for k := 0; k < p; k++ {
				s[j][k], s[k][j] = 0, 0
			}
			sxy[j] = 0
			continue
		}
		m.scale[j] = math.Sqrt(v)
	}
	var g [brMaxFeatures]brVec // Zᵀ Z
	var b brVec                // Zᵀ y
	for j := 0; j < p; j++ {
		for k := 0; k <= j; k++ {
			g[j][k] = s[j][k] / (m.scale[j] * m.scale[k])
			g[k][j] = g[j][k]
		}
		b[j] = sxy[j] / m.scale[j]
	}
	ev, vecs := jacobiEigen(g, p)
	// Vᵀ Zᵀ y, the target's projection on the eigenvectors. Directions of
	// no spread (collinear features: eigenvalues at rounding level) carry
	// none of it and get no weight, as the pseudo-inverse gives them; a
	// rounding residue divided by a vanishing precision ratio would not.
	var vb brVec
	top := 0.0
	for i := 0; i < p; i++ {
		top = max(top, ev[i])
	}
	for i := 0; i < p; i++ {
		if ev[i] <= 1e-12*top {
			ev[i] = 0
			continue
		}
		for j := 0; j < p; j++ {
			vb[i] += vecs[j][i] * b[j]
		}
	}
	coefFor := func(alpha, lambda float64) (brVec, float64) {
		var c brVec
		for i := 0; i < p; i++ {
			if ev[i] == 0 {
				continue
			}
			w := vb[i] / (ev[i] + lambda/alpha)
			for j := 0; j < p; j++ {
				c[j] += vecs[j][i] * w
			}
		}
		// ‖y − Z c‖² from the sums: yᵀy − 2 cᵀZᵀy + cᵀ ZᵀZ c.
		r := syy
		for j := 0; j < p; j++ {
			r -= 2 * c[j] * b[j]
			for k := 0; k < p; k++ {
				r += c[j] * g[j][k] * c[k]
			}
		}
		return c, max(r, 0)
	}
	alpha := 1 / (syy/n + 0x1p-52)
	lambda := 1.0
	var old brVec
	for it := range brMaxIter {
		c, rmse := coefFor(alpha, lambda)
		gamma, norm := 0.0, 0.0
		for i := 0; i < p; i++ {
			gamma += alpha * ev[i] / (lambda + alpha*ev[i])
			norm += c[i] * c[i]
		}
		lambda = (gamma + 2*brPrior) / (norm + 2*brPrior)
		alpha = (n - gamma + 2*brPrior) / (rmse + 2*brPrior)
		if it != 0 {
			d := 0.0
			for j := 0; j < p; j++ {
				d += math.Abs(old[j] - c[j])
			}
			if d < brTol {
				break
			}
		}
		old = c
	}
	m.coef, _ = coefFor(alpha, lambda)
	for j := 0; j < p; j++ {
		if math.IsNaN(m.coef[j]) || math.IsInf(m.coef[j], 0) {
			return bayesRidge{}, false
		}
	}
	m.intercept = ymean
	m.alpha, m.lambda = alpha, lambda
	return m, true
}

// jacobiEigen returns the eigenvalues of the symmetric p×p matrix a and
// its eigenvectors as the columns of the second result, by cyclic Jacobi
// rotations. Eigenvalues of a positive semi-definite matrix come out ≥ 0
// up to rounding, which is clamped.
func jacobiEigen(a [brMaxFeatures]brVec, p int) (brVec, [brMaxFeatures]brVec) {
	var v [brMaxFeatures]brVec
	for i := 0; i < p; i++ {
		v[i][i] = 1
	}
	for sweep := 0; sweep < 64; sweep++ {
		off, diag := 0.0, 0.0
		for i := 0; i < p; i++ {
			diag += a[i][i] * a[i][i]
			for j := i + 1; j < p; j++ {
				off += a[i][j] * a[i][j]
			}
		}
		if off <= 1e-30*(diag+1e-300) {
			break
		}
		for i := 0; i < p; i++ {
			for j := i + 1; j < p; j++ {
				if a[i][j] == 0 {
					continue
				}
				theta := (a[j][j] - a[i][i]) / (2 * a[i][j])
				t := math.Copysign(1, theta) / (math.Abs(theta) + math.Sqrt(theta*theta+1))
				c := 1 / math.Sqrt(t*t+1)
				s := t * c
				for k := 0; k < p; k++ {
					aki, akj := a[k][i], a[k][j]
					a[k][i], a[k][j] = c*aki-s*akj, s*aki+c*akj
				}
				for k := 0; k < p; k++ {
					aik, ajk := a[i][k], a[j][k]
					a[i][k], a[j][k] = c*aik-s*ajk, s*aik+c*ajk
				}
				for k := 0; k < p; k++ {
					vki, vkj := v[k][i], v[k][j]
					v[k][i], v[k][j] = c*vki-s*vkj, s*vki+c*vkj
				}
			}
		}
	}
	var ev brVec
	for i := 0; i < p; i++ {
		ev[i] = max(a[i][i], 0)
	}
	return ev, v
}
