"""A code-first Zope product of the tests: a view that calls the package's
SQL methods, registered by ZCML, as a Pyramid view calls request.sql."""

from Products.Five.browser import BrowserView

from pyramid_dbtune.zope import sql


class Rent(BrowserView):
    """``@@code_rent``: property 1's rent; with ``?rent=``, set first;
    with ``?now=``, read uncached."""

    def __call__(self):
        if 'method' in self.request.form:  # a name that may not be one
            try:
                getattr(sql, self.request.form['method'])
            except AttributeError as exc:
                return str(exc)
        if 'now' in self.request.form:  # a method with no cache time
            return str(sql.get_rent_now(id=1)[0].rent)
        if 'rent' in self.request.form:
            sql.set_rent(id=1, rent=int(self.request.form['rent']))
        return str(sql.get_rent(id=1)[0].rent)
