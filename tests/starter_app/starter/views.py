from pyramid.view import view_config

from .models import MyModel


@view_config(route_name='home', renderer='json')
def home(request):
    one = request.dbsession.query(MyModel).filter(MyModel.name == 'one').one()
    return {'name': one.name, 'value': one.value}


@view_config(route_name='price', renderer='json')
def price(request):
    return {'value': request.sql.model_value(name='one')[0].value}


@view_config(route_name='rename', renderer='json')
def rename(request):
    one = request.dbsession.query(MyModel).filter(MyModel.name == 'one').one()
    one.value = int(request.params['value'])
    if request.params.get('abort'):
        request.dbsession.flush()
        request.tm.doom()
    return {'value': one.value}


@view_config(route_name='bump', renderer='json')
def bump(request):
    request.sql.set_value(name='one', value=int(request.params['value']))
    one = request.dbsession.query(MyModel).filter(MyModel.name == 'one').one()
    return {'value': one.value}
